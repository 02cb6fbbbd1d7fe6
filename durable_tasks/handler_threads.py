"""Threads a worker owns for its sync handlers, fed and answered in batches.

``anyio.to_thread.run_sync`` pays per call: a limiter acquire, a cancel scope, a queue put that
wakes one thread, and a ``call_soon_threadsafe`` (a write to the loop's wake-up pipe) for each
result; every woken thread then contends for the GIL. At thousands of short handlers per second
those hops cost more than the handlers. Here the event loop appends an item to one queue and
wakes a thread only when none is running or on its way; it takes item after item while the queue
holds any. Only when items wait and none started for ``stall`` seconds (the handlers block: I/O,
sleep) are more threads woken, one per waiting item, up to ``limit``; and never before two GIL
switch intervals (``sys.getswitchinterval()``, 5 ms by default) without a start: a thread the busy
loop keeps from the GIL gets it within one interval, so until then it is waiting, not blocked, and
more threads would only wait beside it. Results go back in batches: one loop wake-up carries every
result that arrived since the last.

Cancellation is anyio's ``abandon_on_cancel=True``: a waiter that is cancelled (a task's timeout,
a worker stopping) returns at once; an item not started yet never starts, a running one runs to
its end in its thread, its result dropped, and its thread no longer counts against the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["HandlerThreads"]

T = TypeVar("T")


class _Item:
    __slots__ = ("abandoned", "args", "context", "fn", "future", "outcome", "running")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.args = args
        self.context = contextvars.copy_context()  # the caller's (current task, trace) go along
        self.future = future
        self.running = False
        self.abandoned = False
        self.outcome: tuple[bool, Any] = (False, None)  # (raised, value or exception)


class HandlerThreads:
    """Runs blocking callables on at most ``limit`` threads at a time, for one event loop at
    a time. A thread idle for ``idle_exit`` seconds ends; the next call starts one again."""

    def __init__(
        self, limit: int, *, stall: float = 0.001, idle_exit: float = 10.0, name: str = "durable-tasks-handler"
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.stall = stall  # 0: wake a sibling whenever a thread leaves items behind
        self.idle_exit = idle_exit
        self._name = name
        self._lock = threading.Lock()
        self._queue: deque[_Item] = deque()
        self._threads = 0  # alive
        self._busy = 0  # threads running an item
        self._taken = self._taken_at_check = 0  # items started: all, and at the last stall check
        self._started_seen_at = 0.0  # loop time of the stall check that last saw an item start
        self._abandoned_running = 0  # of those, running an item whose waiter left (not counted)
        self._idle: list[threading.Lock] = []  # one held lock per idle thread, the latest idle last
        self._waking = 0  # threads woken or started that have not taken the lock yet
        self._closed = False
        self._done: list[_Item] = []
        self._stall_check_on: asyncio.AbstractEventLoop | None = None  # the loop a check is due on

    @property
    def threads(self) -> int:
        """Threads alive now (idle ones included)."""
        return self._threads

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the threads, in a copy of the caller's context."""
        loop = asyncio.get_running_loop()
        item = _Item(fn, args, loop.create_future())
        with self._lock:
            self._closed = False
            self._queue.append(item)
            if self._busy == self._abandoned_running:  # else a thread takes it after its item
                self._wake(1)
            arm = self.stall > 0 and self._stall_check_on is not loop  # a loop that ended drops its check
            if arm:
                self._stall_check_on = loop
                self._started_seen_at = loop.time()
        if arm:
            loop.call_later(self.stall, self._check_stall)
        try:
            return cast("T", await item.future)
        except asyncio.CancelledError:
            with self._lock:
                if not item.abandoned:
                    item.abandoned = True
                    if item.running:  # its thread goes on; let another take its place
                        self._abandoned_running += 1
                        if self._queue:
                            self._wake(1)
            raise
        finally:
            # A handler's exception has this frame in its traceback and is held by the item's
            # future: the frame must not hold the item, or the three (and the attempt's context
            # in the handler's frame) make a cycle that only the collector frees.
            del item

    def close(self) -> None:
        """End the idle threads now (a running handler ends its item first); calls not started
        never start. A later :meth:`run_sync` starts threads again."""
        with self._lock:
            self._closed = True
            for item in self._queue:
                item.abandoned = True
            self._queue.clear()
            while self._idle:  # each wakes, finds the queue closed, and ends
                self._waking += 1
                self._idle.pop().release()

    def _wake(self, n: int) -> None:
        """Get up to ``n`` more threads looking at the queue (holding the lock); with ``n`` 1,
        none when one is on its way already (it takes whatever the queue holds)."""
        if n == 1 and self._waking:
            return
        for _ in range(n):
            if self._idle:
                self._waking += 1
                self._idle.pop().release()
            elif self._threads - self._abandoned_running < self.limit:
                self._threads += 1
                self._waking += 1
                threading.Thread(target=self._serve, name=f"{self._name}-{self._threads}", daemon=True).start()
            else:
                return

    def _check_stall(self) -> None:
        """On the loop, every ``stall`` while work waits: when no item started for ``stall`` and
        two GIL switch intervals, the threads are blocked; wake one per waiting item. (Items that
        wait while others start are waiting for the GIL, which more threads would not give them;
        so is a thread that the loop, busy past ``stall``, kept from the GIL for less than a
        switch interval.)"""
        loop = asyncio.get_running_loop()
        now = loop.time()
        with self._lock:
            waiting = len(self._queue)
            if not waiting or self._taken != self._taken_at_check:
                self._started_seen_at = now
            elif not self._waking and now - self._started_seen_at >= max(self.stall, 2 * sys.getswitchinterval()):
                self._wake(waiting - self._waking)  # no thread moved
                self._started_seen_at = now  # the woken ones get as long to start
            if not waiting:
                self._stall_check_on = None
            self._taken_at_check = self._taken
        if waiting:
            loop.call_later(self.stall, self._check_stall)

    def _serve(self) -> None:
        lock = self._lock
        lock.acquire()
        self._waking -= 1
        try:
            while True:
                item = self._next_item()
                if item is None:
                    return
                if self._queue and not self.stall:  # more waiting: a sibling starts on them now
                    self._wake(1)
                item.running = True
                self._busy += 1
                self._taken += 1
                lock.release()
                try:
                    item.outcome = (False, item.context.run(item.fn, *item.args))
                except BaseException as exc:  # handed to the waiter, whatever it is
                    item.outcome = (True, exc)
                finally:
                    lock.acquire()
                item.running = False
                self._busy -= 1
                if item.abandoned:
                    self._abandoned_running -= 1
                else:
                    self._hand_back(item)
                if self._threads - self._abandoned_running > self.limit:
                    return  # an abandoned item came back: the others already took its place
        finally:
            self._threads -= 1
            lock.release()

    def _next_item(self) -> _Item | None:
        """The next live item, waiting for one while idle (holding the lock); None: end."""
        while True:
            while self._queue:
                item = self._queue.popleft()
                if not item.abandoned:
                    return item
            if self._closed:
                return None
            wake = threading.Lock()  # held: a waker releases it
            wake.acquire()
            self._idle.append(wake)
            self._lock.release()
            try:
                wake.acquire(timeout=self.idle_exit)
            finally:
                self._lock.acquire()
            if wake in self._idle:  # nobody woke it: idle too long
                self._idle.remove(wake)
                return None
            self._waking -= 1  # the waker counted it

    def _hand_back(self, item: _Item) -> None:
        """Queue a result for the loop (holding the lock); the first of a batch wakes it."""
        self._done.append(item)
        if len(self._done) == 1:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                item.future.get_loop().call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, []
        for item in done:
            if item.future.done():  # cancelled: abandoned
                continue
            raised, value = item.outcome
            if raised:
                item.future.set_exception(value)
            else:
                item.future.set_result(value)
