"""An attempt's way to the worker's group committer."""

from __future__ import annotations

from .batching import Coalescer
from .store.results import FinalWrite
from .transport.messages import StreamEntry

__all__ = ["PendingCommit"]


class PendingCommit:
    """An attempt's way to the group committer (``commit(write)`` for :func:`run_attempt`),
    with the entry to acknowledge after its result: one object per attempt where a closure
    would be a function and its cells, all alive as long as the attempt."""

    __slots__ = ("acked", "committer", "entry", "write")

    def __init__(self, committer: Coalescer[PendingCommit], entry: StreamEntry) -> None:
        self.committer = committer
        self.entry = entry
        self.write: FinalWrite | None = None
        self.acked = False  # the committer acknowledged the entry

    async def __call__(self, write: FinalWrite) -> None:
        self.write = write
        await self.committer.submit(self)

    @property
    def final_write(self) -> FinalWrite:
        assert self.write is not None, "handed to the committer only once written"
        return self.write
