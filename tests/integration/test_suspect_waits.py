"""An attempt that waits at a worker's isolation gate, while a suspect (a task whose worker was
lost before) runs alone, keeps its lease: the suspect may run longer than a lease, and an
attempt whose lease ran out there would be reclaimed as lost and become a suspect in turn."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.records import tasks_table
from tests.helpers import claim_entry, make_idle, wait_until

pytestmark = pytest.mark.anyio


def lease_of(app: App, task_id: str) -> datetime | None:
    with app.engine.connect() as conn:
        row = conn.execute(
            sa.select(tasks_table.c.state, tasks_table.c.lease_expires_at).where(tasks_table.c.id == task_id)
        ).one()
    return row.lease_expires_at if row.state == TaskState.RUNNING else None


async def test_an_attempt_waiting_behind_a_suspect_keeps_its_lease(make_app: Callable[..., App]) -> None:
    app = make_app(concurrency=4, publish_on_commit=False)  # entries in the order the dispatches below make
    release = threading.Event()

    @app.task(name="slow", queue="gate")
    def slow(ctx: TaskContext[int], n: int) -> int:
        release.wait(60)  # runs alone until the test has seen what it waits for
        return n

    @app.task(name="quick", queue="gate")
    def quick(ctx: TaskContext[int], n: int) -> int:
        return n

    with Session(app.engine) as session:
        suspect = slow.submit(session, 1)
        session.commit()
    assert await app.dispatch_once() == 1
    # Its first worker claims it and dies: the reaper redelivers it, a suspect now.
    [entry] = await app.runtime.transport().read(["gate"], "dead-worker", count=1, block=app.settings.read_block)
    assert await claim_entry(app, entry, "dead-worker", lease=timedelta(milliseconds=1)) is not None
    await make_idle(app, timedelta(seconds=5))
    assert (await app.reap_once()).redelivered == 1
    with Session(app.engine) as session:
        waiting = quick.submit(session, 2)
        session.commit()
    assert await app.dispatch_once() == 2  # the suspect's redelivery, then the quick task: one read
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.work, 2, timedelta(seconds=60))
        await wait_until(lambda: lease_of(app, waiting.id) is not None, what="the quick task's claim")
        first = lease_of(app, waiting.id)
        assert first is not None
        # Renewed while it waits behind the suspect, which does not end before the test says so.
        await wait_until(lambda: (lease_of(app, waiting.id) or first) > first, what="a renewal", timeout=15)
        assert app.get_task(suspect.id).state is TaskState.RUNNING
        release.set()
    for task_id, attempts in ((suspect.id, 2), (waiting.id, 1)):
        info = app.get_task(task_id)
        assert (info.state, len(info.attempts), info.reclaims) == (TaskState.SUCCEEDED, attempts, attempts - 1)
    await app.aclose()
