"""Running suspect attempts apart, in shrinking groups, so a task that kills its workers ends
up dying alone."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio

__all__ = ["IsolationGate"]

T = TypeVar("T")


class _Suspect:
    __slots__ = ("admitted", "limit", "turn")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.turn = anyio.Event()
        self.admitted = False


class IsolationGate:
    """Runs *suspect* attempts apart from the others, in groups no larger than they allow.

    A task whose worker was lost before (``reclaims > 0``) may be the one that kills workers.
    Run beside healthy tasks, it would take them down with it, again and again, until all of
    them reached ``max_deliveries`` together. So suspects run with other suspects only, never
    beside a shared attempt: a suspect waits for the shared attempts to finish, and shared
    attempts wait while any suspect waits or runs. Each suspect brings its group limit
    (:func:`~durable_tasks.policy.suspect_group_limit`, shrinking with each loss): it joins the
    running group only if the group, itself included, stays within every member's limit. A
    suspect of limit 1 runs with nothing beside it, and only its loss counts.

    Suspects are admitted in arrival order: one that does not fit holds back those behind it,
    so a suspect that must run alone gets its turn as soon as the group ahead of it is over.
    """

    def __init__(self) -> None:
        self._suspects = 0  # waiting or running
        self._clear = anyio.Event()  # set while there is no suspect
        self._clear.set()
        self._waiting: deque[_Suspect] = deque()
        self._group: list[int] = []  # the limits of the suspects running
        self._running = 0  # shared attempts inside the gate

    @property
    def isolating(self) -> bool:
        """A suspect attempt is waiting or running."""
        return self._suspects > 0

    @property
    def room(self) -> int:
        """How many more suspects could join the running group now (0 while one waits)."""
        if self._waiting or self._running or not self._group:
            return 0
        return min(self._group) - len(self._group)

    async def join(self, hold: Callable[[T], object], attempt: T) -> None:
        """Start a shared attempt (most attempts): wait while a suspect waits or runs,
        ``hold(attempt)`` keeping the attempt's lease alive meanwhile (the suspects ahead of it
        may take longer than a lease, and an attempt whose lease ran out there would be
        reclaimed as lost, and become a suspect itself). Pair with :meth:`leave`; no context
        manager, because every attempt passes here, nor a closure per attempt for ``hold``:
        the attempt would keep it alive while it runs (more objects for the collector)."""
        if self._suspects:
            hold(attempt)
            while self._suspects:
                await self._clear.wait()
        self._running += 1

    def leave(self) -> None:
        """End a shared attempt."""
        self._running -= 1
        self._admit()

    @asynccontextmanager
    async def suspect(self, *, limit: int, hold: Callable[[], None]) -> AsyncIterator[bool]:
        """Run the block in a group of suspects of at most ``limit`` (``hold`` keeps the lease
        alive while it waits for its turn); yields whether it runs alone (``limit`` 1)."""
        hold()
        me = _Suspect(max(1, limit))
        self._suspects += 1
        if self._suspects == 1:
            self._clear = anyio.Event()
        self._waiting.append(me)
        try:
            self._admit()
            await me.turn.wait()
            yield me.limit == 1
        finally:
            if me.admitted:
                self._group.remove(me.limit)
            else:
                self._waiting.remove(me)
            self._suspects -= 1
            if not self._suspects:
                self._clear.set()
            self._admit()

    def _admit(self) -> None:
        """Let in the waiting suspects, oldest first, while the group stays within every
        member's limit."""
        if self._running:
            return
        while self._waiting:
            head = self._waiting[0]
            size = len(self._group) + 1
            if size > head.limit or (self._group and size > min(self._group)):
                return
            self._waiting.popleft()
            self._group.append(head.limit)
            head.admitted = True
            head.turn.set()
