"""Worker: execution fence, result fence, retries, heartbeats, acknowledgement rules."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Field, Session, SQLModel

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks.records import tasks_table
from durable_tasks.store.engine import read_only
from durable_tasks.transport.keys import CONSUMER_GROUP
from durable_tasks.transport.messages import OutgoingMessage
from durable_tasks.worker import Worker
from tests.helpers import keys, make_idle, submit, wait_until

pytestmark = pytest.mark.anyio


class Job(BaseModel):
    n: int


class Verdict(SQLModel, table=True):
    __tablename__ = "test_verdicts"
    id: int | None = Field(default=None, primary_key=True)
    task_id: str
    generation: int
    value: int


def verdicts(app: App, task_id: str) -> list[tuple[int, int]]:
    with read_only(app.engine).connect() as conn:
        rows: list[Any] = conn.execute(
            sa.select(sa.column("generation"), sa.column("value"))
            .select_from(sa.table("test_verdicts"))
            .where(sa.column("task_id") == task_id)
        ).all()  # type: ignore[assignment]
    return [(r[0], r[1]) for r in rows]


def lease_expires_at(app: App, task_id: str) -> datetime | None:
    t = tasks_table.c
    with read_only(app.engine).connect() as conn:
        expiry: datetime | None = conn.execute(sa.select(t.lease_expires_at).where(t.id == task_id)).scalar_one()
    return expiry if expiry is None or expiry.tzinfo else expiry.replace(tzinfo=UTC)


async def pending_count(app: App, queue: str = "jobs") -> int:
    summary = await app.runtime.transport().client.xpending(keys(app, queue).stream, CONSUMER_GROUP)
    return int(summary["pending"])


@pytest.fixture
def verdict_app(app: App) -> App:
    Verdict.metadata.create_all(app.engine, tables=[Verdict.__table__])  # type: ignore[attr-defined]
    return app


async def test_async_handler_runs_and_hook_writes_inside_the_fenced_commit(verdict_app: App) -> None:
    app = verdict_app

    @app.task(name="double", queue="jobs")
    async def double(ctx: TaskContext[Job], p: Job) -> int:
        await anyio.lowlevel.checkpoint()
        return p.n * 2

    @double.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        session.add(Verdict(task_id=ctx.task_id, generation=ctx.generation, value=result))

    task_id = submit(app, "double", {"n": 21})
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).result == 42
    assert verdicts(app, task_id) == [(0, 42)]
    assert await pending_count(app) == 0


async def test_a_duplicate_entry_runs_nothing_and_is_acked(app: App) -> None:
    runs: list[int] = []

    @app.task(name="count", queue="jobs")
    def count(ctx: TaskContext[Job], p: Job) -> int:
        runs.append(ctx.attempt)
        return p.n

    task_id = submit(app, "count", {"n": 1})
    await app.dispatch_once()
    # A duplicate of the same delivery (what a failed script or a replay would leave).
    await app.runtime.transport().client.xadd(keys(app).stream, {"t": task_id, "g": "0", "d": "0", "n": "count"})
    worker = Worker(app.runtime)
    assert await worker.run(max_tasks=2, timeout=timedelta(seconds=10)) == 2
    assert runs == [1]
    assert worker.counters.skipped_stale == 1
    assert await pending_count(app) == 0


async def test_an_entry_read_before_mark_sent_still_runs_and_the_mark_never_moves_it_back(app: App) -> None:
    @app.task(name="early", queue="jobs")
    def early(ctx: TaskContext[Job], p: Job) -> int:
        return 7

    task_id = submit(app, "early", {"n": 1})
    # Published, but the dispatcher's mark-SENT has not committed: the task is still PENDING.
    await app.runtime.transport().publish([OutgoingMessage("jobs", task_id, 0, 0, "early")])
    assert app.get_task(task_id).state == TaskState.PENDING
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state == TaskState.SUCCEEDED
    await app.dispatch_once()  # the late dispatcher: dedup returns the same entry, mark is fenced
    assert app.get_task(task_id).state == TaskState.SUCCEEDED
    assert await app.runtime.transport().client.xlen(keys(app).stream) == 1


async def test_rerun_while_running_fences_out_the_old_result(verdict_app: App) -> None:
    app = verdict_app
    started, release = anyio.Event(), anyio.Event()

    @app.task(name="judge", queue="jobs")
    async def judge(ctx: TaskContext[Job], p: Job) -> int:
        if ctx.generation == 0:
            started.set()
            await release.wait()
            return 100  # the stale verdict
        return 200

    @judge.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        session.add(Verdict(task_id=ctx.task_id, generation=ctx.generation, value=result))

    task_id = submit(app, "judge", {"n": 1})
    await app.dispatch_once()
    worker = Worker(app.runtime)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(max_tasks=2, timeout=timedelta(seconds=20)))
        await started.wait()
        with Session(app.engine) as s:
            assert app.rerun(s, task_id) == 1
            s.commit()
        await app.dispatch_once()
        release.set()
    info = app.get_task(task_id)
    assert (info.state, info.generation, info.result) == (TaskState.SUCCEEDED, 1, 200)
    assert verdicts(app, task_id) == [(1, 200)]
    assert worker.counters.fenced_out == 1
    assert [(a.generation, a.outcome) for a in info.attempts] == [(0, "fenced_out"), (1, "succeeded")]


async def test_failures_retry_through_new_deliveries_then_fail_after_max_attempts(app: App) -> None:
    @app.task(name="boom", queue="jobs", max_attempts=3)
    def boom(ctx: TaskContext[Job], p: Job) -> int:
        raise RuntimeError(f"broken on attempt {ctx.attempt}")

    task_id = submit(app, "boom", {"n": 1})
    for _ in range(3):
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert await app.dispatch_once() == 0
    info = app.get_task(task_id)
    assert (info.state, info.attempt, info.delivery) == (TaskState.FAILED, 3, 2)
    assert info.error_type == "RuntimeError"
    assert info.error_message == "broken on attempt 3"
    assert [a.outcome for a in info.attempts] == ["failed"] * 3
    assert [a.error_message for a in info.attempts] == [f"broken on attempt {i}" for i in (1, 2, 3)]
    assert all(a.retry_reason and "RuntimeError" in a.retry_reason for a in info.attempts[:2])
    assert info.attempts[2].retry_reason is None
    assert await pending_count(app) == 0


async def test_retry_on_limits_which_errors_retry(app: App) -> None:
    @app.task(name="picky", queue="jobs", max_attempts=5, retry_on=(ConnectionError,))
    def picky(ctx: TaskContext[Job], p: Job) -> int:
        raise ValueError("a bug, not a transient error")

    task_id = submit(app, "picky", {"n": 1})
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    info = app.get_task(task_id)
    assert (info.state, info.attempt) == (TaskState.FAILED, 1)


async def test_a_failing_on_commit_hook_rolls_back_and_retries(verdict_app: App) -> None:
    app = verdict_app

    @app.task(name="hooked", queue="jobs", max_attempts=2)
    def hooked(ctx: TaskContext[Job], p: Job) -> int:
        return ctx.attempt

    @hooked.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        session.add(Verdict(task_id=ctx.task_id, generation=ctx.generation, value=result))
        session.flush()
        if ctx.attempt == 1:
            raise RuntimeError("hook failed after writing")

    task_id = submit(app, "hooked", {"n": 1})
    for _ in range(2):
        await app.dispatch_once()
        await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    info = app.get_task(task_id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, 2)
    assert verdicts(app, task_id) == [(0, 2)]  # attempt 1's row was rolled back with its result
    assert [a.outcome for a in info.attempts] == ["hook_failed", "succeeded"]


async def test_heartbeats_keep_a_long_task_from_being_reclaimed(make_app: Callable[..., App]) -> None:
    """The task runs for three leases of the App's clock; each time the lease would lapse, the
    worker's heartbeat has renewed it, and a reaper pass (its entry idle past the lease) keeps it."""
    clock = FrozenClock()
    app = make_app(clock=clock)
    release = anyio.Event()

    @app.task(name="long", queue="jobs")
    async def long(ctx: TaskContext[Job], p: Job) -> int:
        await release.wait()
        return 1

    task_id = submit(app, "long", {"n": 1})
    await app.dispatch_once()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.work(max_tasks=1, timeout=timedelta(seconds=20)))
        await wait_until(lambda: app.get_task(task_id).state == TaskState.RUNNING, what="the task to start")
        for _ in range(3):
            clock.advance(app.settings.lease_timeout)  # the lease taken or renewed last runs out now
            await wait_until(
                lambda: (lease_expires_at(app, task_id) or clock.now) > clock.now, what="a heartbeat", timeout=10
            )
            assert await make_idle(app, app.settings.lease_timeout + timedelta(seconds=1)) == 1
            report = await app.reap_once()
            assert (report.kept, report.redelivered) == (1, 0)
        release.set()
    info = app.get_task(task_id)
    assert (info.state, len(info.attempts)) == (TaskState.SUCCEEDED, 1)


async def test_entries_added_before_the_group_existed_are_consumed(app: App) -> None:
    @app.task(name="old", queue="jobs")
    def old(ctx: TaskContext[Job], p: Job) -> int:
        return 1

    task_id = submit(app, "old", {"n": 1})
    assert app.runtime.wakeups.flush()  # the XADD at commit creates the stream; no group exists yet
    client = app.runtime.transport().client
    assert await client.xlen(keys(app).stream) == 1
    assert await client.xinfo_groups(keys(app).stream) == []
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state == TaskState.SUCCEEDED


async def test_a_vanished_group_is_recreated(app: App) -> None:
    @app.task(name="again", queue="jobs")
    def again(ctx: TaskContext[Job], p: Job) -> int:
        return 1

    first = submit(app, "again", {"n": 1})
    await app.dispatch_once()
    worker = Worker(app.runtime)
    assert await worker.run(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    await app.runtime.transport().client.xgroup_destroy(keys(app).stream, CONSUMER_GROUP)
    second = submit(app, "again", {"n": 1})
    await app.dispatch_once()
    # The recreated group starts from 0-0: the first entry comes back and is skipped as stale.
    assert await worker.run(max_tasks=2, timeout=timedelta(seconds=10)) == 2
    assert worker.counters.skipped_stale == 1
    assert app.get_task(first).state == app.get_task(second).state == TaskState.SUCCEEDED


async def test_a_worker_that_cannot_reach_the_database_does_not_ack(
    app: App, make_app: Callable[..., App], redis_url: str
) -> None:
    @app.task(name="unreached", queue="jobs")
    def unreached(ctx: TaskContext[Job], p: Job) -> int:
        return 1

    task_id = submit(app, "unreached", {"n": 1})
    await app.dispatch_once()
    cut_off = App("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1", redis_url, app.settings.namespace)

    @cut_off.task(name="unreached", queue="jobs")
    def unreached_there(ctx: TaskContext[Job], p: Job) -> int:
        return 1

    worker = Worker(cut_off.runtime)
    assert await worker.run(max_tasks=1, timeout=timedelta(seconds=3)) == 0
    assert worker.counters.unsettled == 1
    assert await pending_count(app) == 1  # still in the PEL, for the reaper
    assert app.get_task(task_id).state == TaskState.ENQUEUED
    await cut_off.aclose()


async def test_cancel_fences_out_a_running_attempt(verdict_app: App) -> None:
    app = verdict_app
    started, release = anyio.Event(), anyio.Event()

    @app.task(name="cancellable", queue="jobs")
    async def cancellable(ctx: TaskContext[Job], p: Job) -> int:
        started.set()
        await release.wait()
        return 1

    @cancellable.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        session.add(Verdict(task_id=ctx.task_id, generation=ctx.generation, value=result))

    task_id = submit(app, "cancellable", {"n": 1})
    await app.dispatch_once()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.work(max_tasks=1, timeout=timedelta(seconds=10)))
        await started.wait()
        with Session(app.engine) as s:
            assert app.cancel(s, task_id) is True
            s.commit()
        release.set()
    info = app.get_task(task_id)
    assert (info.state, info.result) == (TaskState.CANCELLED, None)
    assert verdicts(app, task_id) == []
    assert [a.outcome for a in info.attempts] == ["fenced_out"]
    with Session(app.engine) as s:
        assert app.cancel(s, task_id) is False


async def test_on_failure_runs_in_the_final_failure_transaction_only(verdict_app: App) -> None:
    app = verdict_app

    @app.task(name="doomed", queue="jobs", max_attempts=2)
    def doomed(ctx: TaskContext[Job], p: Job) -> int:
        raise RuntimeError("always")

    @doomed.on_failure
    def mark(session: Session, ctx: TaskContext[Job], error: BaseException) -> None:
        session.add(Verdict(task_id=ctx.task_id, generation=ctx.generation, value=-1))

    task_id = submit(app, "doomed", {"n": 1})
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    assert verdicts(app, task_id) == []  # a retry is coming: no final-failure hook yet
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    assert app.get_task(task_id).state == TaskState.FAILED
    assert verdicts(app, task_id) == [(0, -1)]


async def test_an_unexpected_error_while_claiming_stops_the_worker_instead_of_vanishing(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims run beside the read loop; a bug in one (not an outage: those leave entries
    pending) must surface from run(), as it did when the read loop awaited each claim."""

    @app.task(name="never-claimed", queue="jobs")
    def never(ctx: TaskContext[Job], p: Job) -> int:
        return 1

    task_id = submit(app, "never-claimed", {"n": 1})
    await app.dispatch_once()

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("claim exploded")

    monkeypatch.setattr(app.runtime.store, "claim_executions", explode)
    with pytest.raises(ExceptionGroup) as raised:  # from the worker's task group
        await Worker(app.runtime).run(max_tasks=1, timeout=timedelta(seconds=10))
    assert raised.group_contains(RuntimeError, match="claim exploded")
    assert app.get_task(task_id).state == TaskState.ENQUEUED  # nothing ran; the entry stays pending
    assert await pending_count(app) == 1
