"""Concurrency slots go back on every way out of an admitted delivery: its attempt ends, its
claim is refused or fails (an outage), the worker stops while it is claimed or while others of
its read batch step aside; and each delivery holds its own slot, even beside another delivery
of the same task (a rerun's generation read with the old one)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from durable_tasks import App, TaskContext
from durable_tasks.flow.gate import FlowKeys
from durable_tasks.records import TaskState, tasks_table
from tests.helpers import run_until, submit, submit_all, wait_until

pytestmark = pytest.mark.anyio


def state_of(app: App, task_id: str) -> TaskState:
    with app.engine.connect() as conn:
        return TaskState(conn.execute(sa.select(tasks_table.c.state).where(tasks_table.c.id == task_id)).scalar_one())


async def slot_members(app: App) -> list[str]:
    """Who holds a slot of user:1's key of the task ``judge``'s own limit, in Redis."""
    slots = FlowKeys(app.settings.namespace).slots("task:judge", "user:1")
    return list(await app.runtime.transport().client.zrange(slots, 0, -1))


async def no_slot_held(app: App) -> bool:
    return not await slot_members(app)


async def holds_only(app: App, member: str) -> bool:
    return await slot_members(app) == [member]


def judge_of(app: App, limit: int = 1) -> None:
    @app.task(name="judge", queue="jobs", concurrency_limit=limit)
    def judge(ctx: TaskContext[int], n: int) -> str:
        return "ok"


async def test_a_claim_the_database_refuses_gives_back_the_slot_so_the_task_runs_later(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(concurrency=2, reaper_interval=timedelta(milliseconds=200))  # it hands the entry out again
    judge_of(app)
    task_id = submit(app, "judge", 1, concurrency_key="user:1")
    claim = app.runtime.store.claim_executions
    failed: list[bool] = []

    async def claim_after_an_outage(*args: Any, **kwargs: Any) -> Any:
        if not failed:  # the first claim meets a database outage; the next ones reach it
            failed.append(True)
            raise OperationalError("SELECT 1", {}, Exception("database unreachable"))
        return await claim(*args, **kwargs)

    monkeypatch.setattr(app.runtime.store, "claim_executions", claim_after_an_outage)
    # The entry stays pending; the reaper hands it out again after the lease (1 s), and the
    # new delivery is admitted: the old one's slot did not outlive its claim.
    await run_until(app, lambda: failed and state_of(app, task_id) == TaskState.SUCCEEDED, timeout=30)
    assert not app.runtime.flow.holding
    await wait_until(partial(no_slot_held, app), timeout=5, what="no slot left in Redis")
    await app.aclose()


@pytest.mark.parametrize("hangs", ["claim_executions", "defer_deliveries"])
async def test_a_worker_stopped_mid_intake_keeps_no_slot(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch, hangs: str
) -> None:
    """Stopped while its read batch's claim (or the deferral of the batch's deliveries over the
    limit) waits on the database, the worker holds no slot afterwards: none is renewed for an
    attempt that never started, so the task runs when a worker of this App starts again."""
    # reads of 2: both tasks of user:1 in one batch; the stop waits out the grace for the intake
    app = make_app(
        concurrency=4, shutdown_grace=timedelta(milliseconds=500), reaper_interval=timedelta(milliseconds=200)
    )
    judge_of(app)
    task_ids = [h.id for h in submit_all(app, "judge", [1, 2], concurrency_key="user:1")]
    assert await app.dispatch_once() == 2
    waiting = anyio.Event()
    real = getattr(app.runtime.store, hangs)

    async def hang(*args: Any, **kwargs: Any) -> Any:
        waiting.set()
        await anyio.sleep_forever()  # a database that stops answering; the worker stops meanwhile

    monkeypatch.setattr(app.runtime.store, hangs, hang)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, reaper=False, stop=stop))
        await waiting.wait()
        stop.set()
    assert not app.runtime.flow.holding  # nothing renews a slot for an attempt that never started
    await wait_until(partial(no_slot_held, app), timeout=5, what="no slot left in Redis")
    monkeypatch.setattr(app.runtime.store, hangs, real)
    done = lambda: all(state_of(app, task_id) == TaskState.SUCCEEDED for task_id in task_ids)  # noqa: E731
    await run_until(app, done, timeout=30)  # the reaper hands the pending entries out again
    await app.aclose()


async def test_a_rerun_read_beside_its_stale_entry_holds_its_own_slot(make_app: Callable[..., App]) -> None:
    app = make_app(concurrency=8)  # reads of 4: both entries of the task come in one batch
    running = anyio.Event()
    release = anyio.Event()

    @app.task(name="judge", queue="jobs", concurrency_limit=2)
    async def judge(ctx: TaskContext[int], n: int) -> str:
        running.set()
        await release.wait()
        return "ok"

    task_id = submit(app, judge, 0, concurrency_key="user:1")
    assert await app.dispatch_once() == 1  # generation 0's entry is on the stream
    with Session(app.engine) as session:
        app.rerun(session, task_id)  # a rejudge before any worker read it
        session.commit()
    assert await app.dispatch_once() == 1  # generation 1's entry behind it
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(app.run, reaper=False, stop=stop))
            await running.wait()
            # Both were admitted; the stale generation 0 gives its own slot back, and the
            # running generation 1 keeps (and renews) its own: the key counts it.
            await wait_until(
                partial(holds_only, app, f"{task_id}:1:0"), timeout=5, what="only generation 1's slot held"
            )
            release.set()
            await wait_until(lambda: state_of(app, task_id) == TaskState.SUCCEEDED, timeout=10, what="the rerun")
            stop.set()
    finally:
        await app.aclose()
