"""An attempt that waits at a worker's isolation gate, while a suspect (a task whose worker was
lost before) runs, keeps its lease: the suspect may run longer than a lease, and an attempt
whose lease ran out there would be reclaimed as lost. It waits claimed but not started, so
that losing its worker meanwhile would not make it a suspect (policy.loss_suspects)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import NamedTuple

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, Task, TaskContext, TaskState
from durable_tasks.records import tasks_table
from tests.helpers import claim_entry, make_idle, task_row, wait_until

pytestmark = pytest.mark.anyio


def lease_of(app: App, task_id: str) -> datetime | None:
    with app.engine.connect() as conn:
        row = conn.execute(
            sa.select(tasks_table.c.state, tasks_table.c.lease_expires_at).where(tasks_table.c.id == task_id)
        ).one()
    return row.lease_expires_at if row.state == TaskState.RUNNING else None


class _Gate(NamedTuple):
    """An app of concurrency 4 (reads of 2) with a ``slow`` task that runs until ``release``
    (``running`` set once it does) and a ``quick`` one."""

    app: App
    slow: Task[int, int]
    quick: Task[int, int]
    running: threading.Event
    release: threading.Event


def _gate_app(make_app: Callable[..., App]) -> _Gate:
    app = make_app(concurrency=4, publish_on_commit=False)  # entries in the order the dispatches below make
    running, release = threading.Event(), threading.Event()

    @app.task(name="slow", queue="gate")
    def slow(ctx: TaskContext[int], n: int) -> int:
        running.set()
        release.wait(60)  # runs until the test has seen what it waits for
        return n

    @app.task(name="quick", queue="gate")
    def quick(ctx: TaskContext[int], n: int) -> int:
        return n

    return _Gate(app, slow, quick, running, release)


async def _suspect(app: App, task: Task[int, int]) -> str:
    """Submit ``task``; its first worker claims it and dies, and the reaper redelivers it: a
    suspect now (its new delivery in the outbox, not yet dispatched). Returns its id."""
    with Session(app.engine) as session:
        task_id = task.submit(session, 1).id
        session.commit()
    assert await app.dispatch_once() == 1
    [entry] = await app.runtime.transport().read(["gate"], "dead-worker", count=1, block=app.settings.read_block)
    assert await claim_entry(app, entry, "dead-worker", lease=timedelta(milliseconds=1)) is not None
    await make_idle(app, timedelta(seconds=5))
    assert (await app.reap_once()).redelivered == 1
    return task_id


async def test_an_attempt_waiting_behind_a_suspect_keeps_its_lease(make_app: Callable[..., App]) -> None:
    app, slow, quick, running, release = _gate_app(make_app)
    suspect = await _suspect(app, slow)
    assert await app.dispatch_once() == 1
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.work, 2, timedelta(seconds=60))
        await wait_until(running.is_set, what="the suspect's run")
        with Session(app.engine) as session:  # read while the worker isolates: it waits at the gate
            waiting = quick.submit(session, 2)
            session.commit()
        assert await app.dispatch_once() == 1
        await wait_until(lambda: lease_of(app, waiting.id) is not None, what="the quick task's claim")
        first = lease_of(app, waiting.id)
        assert first is not None
        assert task_row(app, waiting.id).started_at is None  # claimed held
        # Renewed while it waits behind the suspect, which does not end before the test says so.
        await wait_until(lambda: (lease_of(app, waiting.id) or first) > first, what="a renewal", timeout=15)
        assert app.get_task(suspect).state is TaskState.RUNNING
        assert task_row(app, waiting.id).started_at is None  # still waiting: not started
        release.set()
    for task_id, attempts in ((suspect, 2), (waiting.id, 1)):
        info = app.get_task(task_id)
        assert (info.state, len(info.attempts), info.reclaims) == (TaskState.SUCCEEDED, attempts, attempts - 1)
    assert task_row(app, waiting.id).started_at is not None  # recorded when the gate let it run
    await app.aclose()


async def test_a_read_batch_starts_its_first_time_attempts_before_its_suspects(make_app: Callable[..., App]) -> None:
    """A read batch that holds a suspect and a first-time task: the first-time task runs at once
    (claimed started) and the suspect waits for it, not the other way round. An attempt waiting
    at the gate is one a kill of its worker would take without any of its code having run."""
    app, slow, quick, _, release = _gate_app(make_app)
    suspect = await _suspect(app, slow)
    with Session(app.engine) as session:
        first_time = quick.submit(session, 2)
        session.commit()
    assert await app.dispatch_once() == 2  # the suspect's redelivery first, then the quick task: one read
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.work, 2, timedelta(seconds=60))
        await wait_until(lambda: app.get_task(first_time.id).state is TaskState.SUCCEEDED, what="the quick task")
        release.set()
    assert app.get_task(suspect).state is TaskState.SUCCEEDED
    await app.aclose()
