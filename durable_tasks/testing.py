"""Testing your own tasks: run them to completion in the test's process, with no Redis.

:func:`run_inline` is what Celery's eager mode, dramatiq's ``StubBroker`` and procrastinate's
in-memory connector give their users, with the runtime's real code::

    with testing.run_inline(app) as runner:
        with Session(app.engine) as session:
            handle = judge.submit(session, JudgeRequest(submission_id=1))
            session.commit()
        runner.drain()
        assert handle.result() == ...

Inside the block the App runs on a fresh SQLite file (or ``database_url``) and an in-memory
transport (:class:`~durable_tasks.transport.memory.MemoryTransport`) instead of Redis.
:meth:`InlineRunner.drain` runs the App's own dispatcher and worker until nothing is left to
do: every submitted task is claimed under its fence, run, and committed with its ``on_commit``
hook in the fenced transaction, or fails, retries and ends FAILED exactly as in production.
Retries and delayed tasks do not wait: the App's clock is moved to the next due row (turn that
off with ``advance_clock=False``). After the block the App is back on its own database and
Redis, and the test's database is deleted.

What it does not do: run the reaper (nothing is lost in memory, so nothing needs reclaiming),
run periodic schedules (call ``drain`` after submitting a tick yourself), or behave like
several processes. For those, run the real runtime against real servers: :func:`running`
runs it in a background thread, and the pytest plugin :mod:`durable_tasks.pytest_plugin`
gives fixtures for that path.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from anyio.from_thread import start_blocking_portal

from .app import App
from .clock import Clock
from .dispatcher import Dispatcher
from .errors import DurableTasksError
from .store import open_store
from .transport.memory import MemoryTransport
from .worker import Worker

__all__ = ["InlineRunError", "InlineRunner", "run_inline", "running"]


class InlineRunError(DurableTasksError):
    """A drain could not finish: deliveries were left unsettled (the log says why), or work
    kept coming back past the drain's limits (a task that submits itself forever)."""


class _ShiftedClock:
    """The App's own clock plus the time a drain skipped to reach the next due row."""

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return self.base() + self.offset


class InlineRunner:
    """Runs what an App's tests submit, in the test's process (see :func:`run_inline`)."""

    def __init__(self, app: App, transport: MemoryTransport, clock: _ShiftedClock, *, timeout: timedelta) -> None:
        self.app = app
        #: The in-memory streams (``transport.dead_letters(queue)`` lists a queue's DLQ).
        self.transport = transport
        self.timeout = timeout
        self._clock = clock
        self._dispatcher = Dispatcher(app.runtime)

    @property
    def skipped(self) -> timedelta:
        """How far drains have moved the App's clock past its own time so far."""
        return self._clock.offset

    def advance(self, delta: timedelta) -> None:
        """Move the App's clock forward (a delayed task, a lease, a schedule becomes due)."""
        if delta < timedelta(0):
            raise ValueError("the clock only moves forward")
        self._clock.offset += delta

    def drain(self, *, advance_clock: bool = True, max_deliveries: int = 10_000) -> int:
        """Dispatch and run until no task has anything left to do; returns how many deliveries
        the worker settled (attempts, successful or not, and deliveries a rate or concurrency
        limit put off). With ``advance_clock``, retries' backoffs, delayed tasks and the waits
        of limits are skipped over instead of waited for. Call :meth:`adrain` from async tests."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return anyio.run(lambda: self.adrain(advance_clock=advance_clock, max_deliveries=max_deliveries))
        raise InlineRunError("drain() was called on a running event loop: use `await runner.adrain()` there")

    async def adrain(self, *, advance_clock: bool = True, max_deliveries: int = 10_000) -> int:
        """:meth:`drain` for a running event loop."""
        runtime = self.app.runtime
        queues = runtime.queues()
        ran = 0
        while True:
            while await self._dispatcher.dispatch_once():
                pass
            waiting = self.transport.unread(queues)
            if waiting:
                worker = Worker(runtime, queues=queues)
                settled = await worker.run(max_tasks=waiting, timeout=self.timeout)
                if settled < waiting:
                    raise InlineRunError(
                        f"{waiting - settled} of {waiting} deliveries were not settled within {self.timeout} "
                        "(a database error, or a handler still running: see the log; a slow handler may "
                        "need run_inline(timeout=...))"
                    )
                ran += settled
                if ran > max_deliveries:
                    raise InlineRunError(
                        f"more than {max_deliveries} deliveries ran in one drain: does a task submit itself "
                        "forever? Pass drain(max_deliveries=...) if that many are expected"
                    )
                continue
            if advance_clock and await self._skip_to_next_due():
                continue
            # The App's clock runs on while this looks: a row due between the last claim and the
            # probe for the next due time (which reads only rows not due yet) is claimed here.
            if not await self._dispatcher.dispatch_once():
                return ran

    async def _skip_to_next_due(self) -> bool:
        """Move the clock to the earliest row not due yet; False when there is none."""
        runtime = self.app.runtime
        now = runtime.clock()
        due = await runtime.store.next_due(runtime.settings.namespace, now=now)
        if due is None:
            return False
        self._clock.offset += max(due - now, timedelta(0)) + timedelta(microseconds=1)
        return True


@contextlib.contextmanager
def run_inline(
    app: App,
    *,
    database_url: str | None = None,
    create_all: bool = True,
    timeout: timedelta = timedelta(seconds=60),
) -> Iterator[InlineRunner]:
    """Run ``app`` in this process until the block ends, on a test database and no Redis.

    ``database_url`` defaults to a new SQLite file in a temporary directory, deleted after the
    block; pass one to run on another database (PostgreSQL: the same statements as production).
    ``create_all`` creates the runtime's tables and the App's ``tables`` there first.
    ``timeout`` bounds one round of a drain (a handler that runs longer fails the drain).
    Nothing is started that outlives the block: no server, no thread, no event loop.
    """
    scratch = Path(tempfile.mkdtemp(prefix="dt-inline-")) if database_url is None else None
    url = database_url or f"sqlite:///{scratch}/inline.sqlite3"
    settings = app.settings.model_copy(update={"database_url": url})
    store = open_store(settings)
    s = app.settings
    key = s.signing_key.get_secret_value().encode() if s.signing_key else None
    original_clock = app.clock
    clock = _ShiftedClock(original_clock)
    transport = MemoryTransport(s.namespace, clock=clock, partitions=s.queue_partitions, signing_key=key)
    app.results.close()  # waits started before the block subscribed to Redis
    try:
        with app.runtime.substituted(store, transport):
            app.clock = clock
            try:
                if create_all:
                    app.create_all()
                yield InlineRunner(app, transport, clock, timeout=timeout)
            finally:
                app.clock = original_clock
                app.results.close()
    finally:
        store.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def running(app: App, *, shutdown: timedelta = timedelta(seconds=30), **options: Any) -> Iterator[App]:
    """Run ``app``'s dispatcher, worker and reaper (:meth:`App.run <durable_tasks.App.run>`,
    with ``options``) on its real database and Redis, in a background thread, until the block
    ends; then stop them gracefully and close the App's connections of that thread.

    The block submits and waits for results as the application would (``handle.result()``).
    An error that ends the runtime early (an unreachable server, a missing schema) is raised
    when the block ends; ``shutdown`` bounds how long stopping may take.
    """
    with start_blocking_portal() as portal:
        stop = portal.call(anyio.Event)

        async def run() -> None:
            try:
                await app.run(stop=stop, **options)
            finally:
                await app.aclose()

        future = portal.start_task_soon(run)
        try:
            yield app
        finally:
            if not future.done():
                portal.call(stop.set)
            future.result(timeout=shutdown.total_seconds())
