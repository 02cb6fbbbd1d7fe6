"""Group commit of fenced results.

Results that finish while a commit is in flight wait for the next one, which takes them all
(up to ``max_batch``) in ONE transaction; each row is still fenced on its own (see
:func:`.store.execution.commit_results`). At low load a result commits at once; under load
one commit carries many results, which is where a per-result commit would cap a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import anyio
import sqlalchemy as sa
from anyio import to_thread

from .store.execution import FinalWrite, commit_results

__all__ = ["GroupCommitter"]


@dataclass(slots=True)
class _Waiting:
    write: FinalWrite
    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None


class GroupCommitter:
    """Coalesces concurrent final writes into shared transactions."""

    def __init__(self, engine: sa.Engine, clock: Callable[[], datetime], *, max_batch: int, window: timedelta) -> None:
        self._engine = engine
        self._clock = clock
        self._max_batch = max_batch
        self._window = window.total_seconds()
        self._queue: list[_Waiting] = []
        self._wakeup = anyio.Event()

    async def commit(self, write: FinalWrite) -> None:
        """Commit ``write`` (its ``outcome`` is set); raises what the transaction raised."""
        waiting = _Waiting(write)
        self._queue.append(waiting)
        self._wakeup.set()
        await waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error

    async def run(self) -> None:
        """Flush batches until cancelled (run it in the worker's task group)."""
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            if self._window and len(self._queue) < self._max_batch:
                await anyio.sleep(self._window)
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                await self._flush(batch)

    async def _flush(self, batch: list[_Waiting]) -> None:
        writes = [w.write for w in batch]
        try:
            with anyio.CancelScope(shield=True):  # a started commit finishes, so its waiters learn
                await to_thread.run_sync(lambda: commit_results(self._engine, writes, now=self._clock()))
        except Exception as exc:
            for w in batch:
                w.error = exc
        finally:
            for w in batch:
                w.done.set()
