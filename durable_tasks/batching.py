"""Coalescing: many concurrent callers, one round trip.

Items submitted while a flush is in flight wait for the next flush, which takes them all (up
to ``max_batch``). At low load an item is flushed at once; under load one flush carries many.
The worker uses it for fenced result commits (one transaction per group, each row still
fenced on its own) and for XACKs (one call per stream per group).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, TypeVar

import anyio

__all__ = ["Coalescer"]

T = TypeVar("T")


@dataclass(slots=True)
class _Waiting(Generic[T]):
    item: T
    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None


class Coalescer(Generic[T]):
    """Runs ``flush(items)`` for batches of submitted items; each submitter waits for its batch."""

    def __init__(
        self, flush: Callable[[Sequence[T]], Awaitable[None]], *, max_batch: int, window: timedelta = timedelta(0)
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._window = window.total_seconds()
        self._queue: list[_Waiting[T]] = []
        self._wakeup = anyio.Event()

    async def submit(self, item: T) -> None:
        """Hand ``item`` to the next flush and wait for it; raises what that flush raised."""
        waiting = _Waiting(item)
        self._queue.append(waiting)
        self._wakeup.set()
        await waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error

    async def run(self) -> None:
        """Flush batches until cancelled (run it in the owner's task group)."""
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            if self._window and len(self._queue) < self._max_batch:
                await anyio.sleep(self._window)
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                await self._flush_batch(batch)

    async def _flush_batch(self, batch: list[_Waiting[T]]) -> None:
        try:
            with anyio.CancelScope(shield=True):  # a started flush finishes, so its waiters learn
                await self._flush([w.item for w in batch])
        except Exception as exc:
            for w in batch:
                w.error = exc
        finally:
            for w in batch:
                w.done.set()
