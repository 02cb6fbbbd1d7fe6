"""The bytes of large payloads one worker holds at once (``Settings.payload_memory``).

A claim carries payloads up to :data:`.store.payloads.INLINE_PAYLOAD_BYTES` (64 KiB), so a
worker's small payloads are bounded by its concurrency. A larger one is read only once this
budget has room for it, and its bytes go back when the attempt ends. Without it a worker at its
default concurrency (512) held every claimed payload of 1 MB, as text and decoded: 1.1 GB.

Room is handed out in arrival order, so a large payload is not passed over forever by smaller
ones behind it; one larger than the whole budget waits for all of it and then runs alone.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import anyio

from .store.execution import ExecutionClaim

__all__ = ["PayloadMemory"]


class _Leases(Protocol):
    def hold(self, claim: ExecutionClaim) -> None: ...


class PayloadMemory:
    """A weighted semaphore over bytes, first come first served."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._waiting: deque[tuple[int, anyio.Event]] = deque()

    async def room_for(self, claim: ExecutionClaim, leases: _Leases) -> int:
        """Wait for room for ``claim``'s payload when the claim did not carry it, its lease kept
        meanwhile; returns what to :meth:`release` (0 for a payload the claim carried)."""
        if claim.payload_json is not None:
            return 0
        leases.hold(claim)
        return await self.acquire(claim.payload_size)

    async def acquire(self, size: int) -> int:
        """Wait until ``size`` bytes (at most the whole capacity) are free and take them;
        returns what to :meth:`release`."""
        size = min(size, self.capacity)
        if not self._waiting and size <= self.free:
            self.free -= size
            return size
        waiter = (size, anyio.Event())
        self._waiting.append(waiter)
        try:
            await waiter[1].wait()
        except BaseException:  # cancelled: give back what was handed over, or leave the line
            if waiter[1].is_set():
                self.release(size)
            else:
                self._waiting.remove(waiter)
                self._hand_out()  # the head may have been what held the others back
            raise
        return size

    def release(self, size: int) -> None:
        """Give back what :meth:`acquire` returned."""
        self.free += size
        self._hand_out()

    def _hand_out(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            size, event = self._waiting.popleft()
            self.free -= size
            event.set()
