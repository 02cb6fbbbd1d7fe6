"""Coalescing: many concurrent callers, one round trip.

Items submitted while a flush is in flight wait for the next flush, which takes them all (up
to ``max_batch``). At low load an item is flushed at once; under load one flush carries many.
The worker uses it for fenced result commits (one transaction per group, each row still
fenced on its own) and for XACKs (one call per stream per group).

Waiters share their batch's event: submitting costs a list append, not an event per item.
With ``concurrency`` > 1 the next batch flushes while the previous one still waits on I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Generic, TypeVar

import anyio

__all__ = ["Coalescer"]

T = TypeVar("T")


class _Batch(Generic[T]):
    __slots__ = ("done", "error", "items")

    def __init__(self) -> None:
        self.items: list[T] = []
        self.done = anyio.Event()
        self.error: BaseException | None = None


class Coalescer(Generic[T]):
    """Runs ``flush(items)`` for batches of submitted items; each submitter waits for its batch."""

    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[None]],
        *,
        max_batch: int,
        window: timedelta = timedelta(0),
        concurrency: int = 1,
    ) -> None:
        self._flush = flush
        self._slots = anyio.Semaphore(concurrency)
        self._max_batch = max_batch
        self._window = window.total_seconds()
        self._open: _Batch[T] = _Batch()
        self._full: deque[_Batch[T]] = deque()
        self._wakeup = anyio.Event()

    async def submit(self, item: T) -> None:
        """Hand ``item`` to the next flush and wait for it; raises what that flush raised."""
        batch = self._open
        batch.items.append(item)
        if len(batch.items) >= self._max_batch:
            self._full.append(batch)
            self._open = _Batch()
        if not self._wakeup.is_set():
            self._wakeup.set()
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    async def run(self) -> None:
        """Flush batches, up to ``concurrency`` at once, until cancelled (run it in the owner's
        task group). A batch keeps filling while every flush slot is busy."""
        async with anyio.create_task_group() as flushes:
            while True:
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                if self._window and not self._full:
                    await anyio.sleep(self._window)
                while self._full or self._open.items:
                    await self._slots.acquire()
                    if self._full:
                        batch = self._full.popleft()
                    else:
                        batch, self._open = self._open, _Batch()
                    flushes.start_soon(self._flush_batch, batch)

    async def _flush_batch(self, batch: _Batch[T]) -> None:
        try:
            with anyio.CancelScope(shield=True):  # a started flush finishes, so its waiters learn
                await self._flush(batch.items)
        except Exception as exc:
            batch.error = exc
        finally:
            self._slots.release()
            batch.done.set()
