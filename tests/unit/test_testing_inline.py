"""durable_tasks.testing.run_inline: submitted tasks run to completion in the test's process on
SQLite, with no Redis: handlers, on_commit and on_failure hooks, retries, fences, delays."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Field, Session, SQLModel, select

from durable_tasks import App, AttemptOutcome, FrozenClock, Task, TaskContext, TaskState, testing
from durable_tasks.store.outbox import ClaimedDelivery
from durable_tasks.testing import InlineRunError


class InlineVerdict(SQLModel, table=True):
    __tablename__ = "test_inline_verdicts"
    id: int | None = Field(default=None, primary_key=True)
    task_id: str
    generation: int
    text: str


class Job(BaseModel):
    text: str
    fail_until: int = 0  # the attempt that first succeeds (0: the first)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> App:
    for name in ("DT_DATABASE_URL", "DT_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return App(namespace="inline", data_dir=tmp_path / "dt", tables=[InlineVerdict], max_deliveries=5)


class Overlap:
    """How many handlers hold their slot at once, at the most."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0

    async def hold(self) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        await anyio.sleep(0.05)  # the work: holds its slot meanwhile
        self.running -= 1


def shout_task(app: App, *, max_attempts: int = 3) -> Task[Job, str]:
    @app.task(name="shout", max_attempts=max_attempts)
    def shout(ctx: TaskContext[Job], job: Job) -> str:
        if ctx.attempt < job.fail_until:
            raise ValueError(f"attempt {ctx.attempt} fails")
        return job.text.upper()

    @shout.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: str) -> None:
        session.add(InlineVerdict(task_id=ctx.task_id, generation=ctx.generation, text=result))

    @shout.on_failure
    def save_failure(session: Session, ctx: TaskContext[Job], error: BaseException) -> None:
        session.add(InlineVerdict(task_id=ctx.task_id, generation=ctx.generation, text=f"failed: {error}"))

    return shout


def submit(app: App, task: Task[Job, str], *jobs: Job, delay: timedelta | None = None) -> list[str]:
    with Session(app.engine) as session:
        ids = [task.submit(session, job, delay=delay).id for job in jobs]
        session.commit()
    return ids


def verdicts(app: App) -> list[tuple[str, int, str]]:
    with Session(app.engine) as session:
        rows = session.exec(select(InlineVerdict).order_by(sa.column("id"))).all()
        return [(r.task_id, r.generation, r.text) for r in rows]


def test_one_drain_runs_tasks_and_their_hooks_without_redis(app: App, tmp_path: Path) -> None:
    shout = shout_task(app)
    with testing.run_inline(app) as runner:
        ids = submit(app, shout, Job(text="a"), Job(text="b"))
        assert runner.drain() == 2
        assert [app.get_task(i).state for i in ids] == [TaskState.SUCCEEDED] * 2
        assert sorted(verdicts(app)) == sorted([(ids[0], 0, "A"), (ids[1], 0, "B")])
        # handle.result() reads the database: nothing to subscribe to
        with Session(app.engine) as session:
            handle = shout.submit(session, Job(text="c"))
            session.commit()
        runner.drain()
        assert handle.result(timeout=5) == "C"
    assert not (tmp_path / "dt" / "valkey.json").exists(), "an embedded Valkey was started"
    assert app._redis_url is None


def test_retries_run_at_once_and_end_failed_with_the_failure_hook(app: App) -> None:
    shout = shout_task(app, max_attempts=3)
    with testing.run_inline(app) as runner:
        flaky, doomed = submit(app, shout, Job(text="f", fail_until=3), Job(text="d", fail_until=9))
        assert runner.drain() == 6  # 3 attempts each
        assert runner.skipped > timedelta(0), "the retries' backoff was skipped, not waited for"
        info = app.get_task(flaky)
        assert (info.state, info.result) == (TaskState.SUCCEEDED, "F")
        assert [a.outcome for a in info.attempts] == [AttemptOutcome.FAILED] * 2 + [AttemptOutcome.SUCCEEDED]
        assert app.get_task(doomed).state == TaskState.FAILED
        assert (doomed, 0, "failed: attempt 3 fails") in verdicts(app)


def test_a_rerun_in_flight_fences_out_the_older_generation(app: App) -> None:
    started: list[int] = []

    @app.task(name="judge")
    def judge(ctx: TaskContext[Job], job: Job) -> str:
        started.append(ctx.generation)
        if ctx.generation == 0:  # a rejudge lands while the first generation still runs
            with Session(app.engine) as session:
                app.rerun(session, ctx.task_id)
                session.commit()
        return f"{job.text}@{ctx.generation}"

    @judge.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: str) -> None:
        session.add(InlineVerdict(task_id=ctx.task_id, generation=ctx.generation, text=result))

    with testing.run_inline(app) as runner:
        [task_id] = submit(app, judge, Job(text="x"))
        runner.drain()
        info = app.get_task(task_id)
        assert started == [0, 1]
        assert (info.state, info.generation, info.result) == (TaskState.SUCCEEDED, 1, "x@1")
        assert [a.outcome for a in info.attempts] == [AttemptOutcome.FENCED_OUT, AttemptOutcome.SUCCEEDED]
        assert verdicts(app) == [(task_id, 1, "x@1")], "the fenced-out result's hook must not have written"


def test_delayed_tasks_wait_unless_the_drain_moves_the_clock(app: App) -> None:
    shout = shout_task(app)
    with testing.run_inline(app) as runner:
        [later] = submit(app, shout, Job(text="later"), delay=timedelta(hours=2))
        assert runner.drain(advance_clock=False) == 0
        assert app.get_task(later).state == TaskState.PENDING
        runner.advance(timedelta(hours=1))
        assert runner.drain(advance_clock=False) == 0
        assert runner.drain() == 1
        assert app.get_task(later).state == TaskState.SUCCEEDED
        assert runner.skipped > timedelta(hours=1, minutes=59)  # less the real time the test took


def test_a_row_that_falls_due_after_the_last_claim_looked_runs_before_the_drain_returns(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    shout = shout_task(app)
    app.clock = clock = FrozenClock()
    with testing.run_inline(app) as runner:
        [task_id] = submit(app, shout, Job(text="late"), delay=timedelta(seconds=1))
        store = app.runtime.store
        lease_outbox = store.lease_outbox
        looked = False

        async def claim_while_the_clock_runs_on(namespace: str, **options: Any) -> list[ClaimedDelivery]:
            nonlocal looked
            rows = await lease_outbox(namespace, **options)
            if not rows and not looked:  # the row falls due right after this claim found nothing
                looked = True
                clock.advance(timedelta(seconds=2))
            return rows

        monkeypatch.setattr(store, "lease_outbox", claim_while_the_clock_runs_on)
        # the next-due probe now finds no row still to come: only another claim sees it
        ran = runner.drain()
        info = app.get_task(task_id)
        assert (info.state, info.result) == (TaskState.SUCCEEDED, "LATE")
        assert ran == 1
        assert runner.skipped == timedelta(0), "the row fell due on the App's own clock"


def test_the_app_is_back_on_its_own_database_after_the_block(app: App, tmp_path: Path) -> None:
    shout = shout_task(app)
    with testing.run_inline(app) as runner:
        inline_url = str(app.engine.url)
        [task_id] = submit(app, shout, Job(text="a"))
        runner.drain()
    scratch = Path(inline_url.removeprefix("sqlite:///")).parent
    assert not scratch.exists(), "the test database is deleted"
    assert str(app.engine.url) != inline_url
    app.create_all()
    assert (tmp_path / "dt" / "durable_tasks.sqlite3").exists()
    with pytest.raises(Exception, match="no task"):
        app.get_task(task_id)
    app.runtime.store.close()


def test_a_task_that_submits_itself_forever_fails_the_drain(app: App) -> None:
    @app.task(name="forever")
    def forever(ctx: TaskContext[int], n: int) -> int:
        with Session(app.engine) as session:
            loop.submit(session, n + 1)
            session.commit()
        return n

    loop: Task[int, int] = forever
    with testing.run_inline(app) as runner:
        with Session(app.engine) as session:
            forever.submit(session, 0)
            session.commit()
        with pytest.raises(InlineRunError, match="more than 20 deliveries"):
            runner.drain(max_deliveries=20)


@pytest.mark.anyio
async def test_async_tests_await_adrain_and_drain_says_so(app: App) -> None:
    shout = shout_task(app)
    with testing.run_inline(app) as runner:
        [task_id] = submit(app, shout, Job(text="async"))
        with pytest.raises(InlineRunError, match=r"await runner\.adrain"):
            runner.drain()
        assert await runner.adrain() == 1
        assert app.get_task(task_id).result == "ASYNC"


def test_higher_priority_levels_run_first(app: App) -> None:
    order: list[str] = []

    @app.task(name="ranked", priority=0)
    def ranked(ctx: TaskContext[str], label: str) -> None:
        order.append(label)

    app.settings.concurrency = 1  # one delivery read at a time: the order is the read order
    with testing.run_inline(app) as runner:
        with Session(app.engine) as session:
            for label, priority in (("low-1", 0), ("low-2", 0), ("high", 3), ("mid", 1)):
                ranked.submit(session, label, priority=priority)
            session.commit()
        assert runner.drain() == 4
    assert order == ["high", "mid", "low-1", "low-2"]


def test_rate_limits_hold_on_the_apps_clock_and_the_drain_skips_their_waits(app: App) -> None:
    @app.task(name="paced", rate_limit="60/m")  # one a second
    def paced(ctx: TaskContext[int], n: int) -> int:
        return n

    with testing.run_inline(app) as runner:
        with Session(app.engine) as session:
            ids = [paced.submit(session, n).id for n in range(4)]
            session.commit()
        runner.drain()
        starts = sorted(info.started_at for info in map(app.get_task, ids) if info.started_at is not None)
        assert [app.get_task(i).state for i in ids] == [TaskState.SUCCEEDED] * 4
    assert len(starts) == 4
    assert all(later - earlier >= timedelta(milliseconds=990) for earlier, later in itertools.pairwise(starts))
    assert runner.skipped > timedelta(seconds=1), "the limit's waits (3 s in all) were skipped, not slept"


def test_a_concurrency_limit_runs_one_at_a_time(app: App) -> None:
    overlap = Overlap()

    @app.task(name="single", concurrency_limit=1)
    async def single(ctx: TaskContext[int], n: int) -> int:
        await overlap.hold()
        return n

    with testing.run_inline(app) as runner:
        with Session(app.engine) as session:
            ids = [single.submit(session, n).id for n in range(3)]
            session.commit()
        runner.drain()
        assert [app.get_task(i).state for i in ids] == [TaskState.SUCCEEDED] * 3
    assert overlap.most == 1


@pytest.mark.anyio
async def test_run_time_limit_settings_apply_inline(app: App) -> None:
    overlap = Overlap()

    @app.task(name="pair", concurrency_limit=1)
    async def pair(ctx: TaskContext[int], n: int) -> int:
        await overlap.hold()
        return n

    with testing.run_inline(app) as runner:
        await app.set_limit("task:pair", concurrency=2)
        [info] = await app.limits_status()
        assert (info.concurrency, info.changed) == (2, True)
        with Session(app.engine) as session:
            for n in range(4):
                pair.submit(session, n)
            session.commit()
        await runner.adrain()
        assert await app.clear_limit("task:pair") is True
    assert overlap.most == 2
