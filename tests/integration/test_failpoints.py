"""Each failpoint fires where it says, and the runtime recovers from a fault there."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Field, Session, SQLModel

from durable_tasks import App, TaskContext, TaskState, failpoints
from durable_tasks.clock import system_clock
from durable_tasks.store.engine import read_only
from tests.helpers import make_idle

pytestmark = pytest.mark.anyio


class Effect(SQLModel, table=True):
    __tablename__ = "test_fp_effects"
    id: int | None = Field(default=None, primary_key=True)
    task_id: str


@pytest.fixture(autouse=True)
def disarm() -> Iterator[None]:
    failpoints.disable_all()
    yield
    failpoints.disable_all()


def effects(app: App, task_id: str) -> int:
    with read_only(app.engine).connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(sa.table("test_fp_effects"))
                .where(sa.column("task_id") == task_id)
            ).scalar_one()
        )


def setup(app: App) -> str:
    Effect.metadata.create_all(app.engine, tables=[Effect.__table__])  # type: ignore[attr-defined]

    @app.task(name="fp", queue="fp")
    def fp(ctx: TaskContext[int], n: int) -> int:
        return n

    @fp.on_commit
    def write(session: Session, ctx: TaskContext[int], result: int) -> None:
        session.add(Effect(task_id=ctx.task_id))

    with Session(app.engine) as s:
        task_id = app.submit(s, "fp", 1).id
        s.commit()
    return task_id


async def settle(app: App, task_id: str) -> None:
    """Run the pipeline until the task succeeds. The reaper finds the faulted attempt without
    waiting out its lease: the App's clock is moved past it and the pending entries are given
    that idle time (``XCLAIM ... IDLE``)."""
    past_lease = app.settings.lease_timeout + timedelta(seconds=1)
    clock = app.clock
    app.clock = lambda: clock() + past_lease
    with anyio.fail_after(30):
        while app.get_task(task_id).state != TaskState.SUCCEEDED:
            await app.dispatch_once()
            await app.work(max_tasks=1, timeout=timedelta(seconds=0.5))
            await make_idle(app, past_lease)
            await app.reap_once()


@pytest.mark.parametrize("point", ["worker.after_claim", "worker.after_run", "worker.after_commit"])
async def test_a_worker_fault_leaves_the_entry_pending_and_the_task_recovers(app: App, point: str) -> None:
    task_id = setup(app)
    failpoints.enable(point, "raise*1")
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=2)) == 0  # the fault: nothing settled, nothing acked
    summary = await app.runtime.transport().client.xpending(app.runtime.transport().keys("fp").stream, "dt-workers")
    assert summary["pending"] == 1
    await settle(app, task_id)
    assert effects(app, task_id) == 1  # the final write happened once, whatever ran twice


@pytest.mark.parametrize("point", ["dispatch.after_claim", "dispatch.after_xadd"])
async def test_a_dispatcher_fault_is_retried_without_a_second_entry(app: App, point: str) -> None:
    task_id = setup(app)
    failpoints.enable(point, "raise*1")
    with pytest.raises(failpoints.FailpointError):
        await app.dispatch_once()
    # The crashed pass still holds the claim lease (30 s): move the clock past it, no sleeping.
    app.clock = lambda: system_clock() + timedelta(seconds=31)
    await settle(app, task_id)
    stream_len = await app.runtime.transport().client.xlen(app.runtime.transport().keys("fp").stream)
    assert stream_len == 1  # the republish hit the dedup key
    assert effects(app, task_id) == 1


async def test_the_reaper_fault_between_reclaim_and_ack_is_harmless(app: App) -> None:
    task_id = setup(app)
    await app.dispatch_once()
    await app.runtime.transport().read(["fp"], "dies", count=1, block=timedelta(milliseconds=100))
    await make_idle(app, app.settings.lease_timeout + timedelta(seconds=1))  # its reader died past the lease
    failpoints.enable("reaper.after_reclaim", "raise*1")
    with pytest.raises(failpoints.FailpointError):
        await app.reap_once()
    assert app.get_task(task_id).delivery == 1  # the new delivery is written; the old entry not acked
    await settle(app, task_id)
    assert effects(app, task_id) == 1


def test_unknown_failpoints_and_actions_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.enable("nowhere", "crash")
    with pytest.raises(ValueError, match="unknown failpoint action"):
        failpoints.enable("worker.after_run", "explode")
