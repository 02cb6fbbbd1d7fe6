"""Running a suspect attempt alone, so a task that kills its workers dies alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

__all__ = ["IsolationGate"]


class IsolationGate:
    """Runs a *suspect* attempt alone.

    A task whose worker was lost before (``reclaims > 0``) may be the one that kills workers.
    Run beside others, it would take them down with it, again and again, until all of them
    reached ``max_deliveries`` together. So a suspect waits for the running attempts to finish,
    runs with nothing beside it, and only then lets others start: a poison task ends in the
    DLQ alone, and the tasks it happened to share a worker with complete.
    """

    def __init__(self) -> None:
        self._exclusive = anyio.Lock()  # one suspect at a time
        self._suspects = 0  # waiting or running
        self._clear = anyio.Event()  # set while there is no suspect
        self._clear.set()
        self._running = 0  # shared attempts inside the gate
        self._idle = anyio.Event()

    @property
    def isolating(self) -> bool:
        """A suspect attempt is waiting or running."""
        return self._suspects > 0

    async def join(self, *, hold: Callable[[], None]) -> None:
        """Start a shared attempt (most attempts): wait while a suspect waits or runs, ``hold``
        keeping the attempt's lease alive meanwhile (the suspects ahead of it may take longer
        than a lease, and an attempt whose lease ran out there would be reclaimed as lost, and
        become a suspect itself). Pair with :meth:`leave`; no context manager, because every
        attempt passes here."""
        if self._suspects:
            hold()
            while self._suspects:
                await self._clear.wait()
        self._running += 1

    def leave(self) -> None:
        """End a shared attempt."""
        self._running -= 1
        if not self._running:
            self._idle.set()

    @asynccontextmanager
    async def alone(self, *, hold: Callable[[], None]) -> AsyncIterator[None]:
        """Run the block with no other attempt beside it; ``hold`` keeps the suspect's lease
        alive while it waits for its turn."""
        hold()
        self._suspects += 1
        if self._suspects == 1:
            self._clear = anyio.Event()
        try:
            async with self._exclusive:
                while self._running:
                    self._idle = anyio.Event()
                    await self._idle.wait()
                yield
        finally:
            self._suspects -= 1
            if not self._suspects:
                self._clear.set()
