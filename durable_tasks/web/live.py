"""Live overview over Server-Sent Events, woken by the runtime's own notifications.

One loop per dashboard, running only while a browser listens: it collects a snapshot, hands
it to every subscriber, then waits on the same waiter as the dispatcher (a Postgres NOTIFY
from a submit ends the wait at once; elsewhere, and for what sends no notification such as
finishing tasks, the poll interval does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from ..app import App
from .overview import Overview, Snapshot

__all__ = ["Live"]

logger = logging.getLogger(__name__)

#: NOTIFY storms (a burst of submits) collapse into one refresh per this interval.
MIN_REFRESH = timedelta(milliseconds=250)
KEEPALIVE = timedelta(seconds=15)


class Live:
    """Fans one stream of overview snapshots out to the browsers that listen."""

    def __init__(self, app: App, overview: Overview, *, poll_interval: timedelta) -> None:
        self.app = app
        self.overview = overview
        self.poll_interval = poll_interval
        self._subscribers: set[asyncio.Queue[Snapshot]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        waiter = self.app.runtime.outbox_waiter()
        try:
            await waiter.listen()  # before the first snapshot: a change committed after it wakes the wait
            while self._subscribers:
                try:
                    snapshot = await self.overview.snapshot()
                except Exception:  # a database or Redis outage: say so, keep listening
                    logger.exception("the dashboard's overview refresh failed; retrying")
                else:
                    for queue in self._subscribers:
                        if queue.full():  # a slow browser gets the newest snapshot, not a backlog
                            queue.get_nowait()
                        queue.put_nowait(snapshot)
                await asyncio.sleep(MIN_REFRESH.total_seconds())
                await waiter.wait(self.poll_interval)
        finally:
            await waiter.aclose()

    async def stream(self, render: Callable[[Snapshot], str]) -> AsyncIterator[str]:
        """SSE frames for one browser: an ``overview`` event with rendered HTML per snapshot."""
        queue: asyncio.Queue[Snapshot] = asyncio.Queue(maxsize=1)
        self._subscribers.add(queue)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run())
        try:
            yield "retry: 2000\n\n"
            while True:
                try:
                    snapshot = await asyncio.wait_for(queue.get(), KEEPALIVE.total_seconds())
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                data = "\n".join(f"data: {line}" for line in render(snapshot).splitlines())
                yield f"event: overview\n{data}\n\n"
        finally:
            self._subscribers.discard(queue)
            if not self._subscribers and self._loop_task is not None:
                self._loop_task.cancel()  # nobody listens: stop querying
