"""durable-tasks prune: old settled rows go in bounded batches; pending work never does; doctor
warns while final tasks outlive DT_RETENTION."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks import reaper as reaper_module
from durable_tasks.doctor import Facts, Finding, Level, check_retention, diagnose, gather_facts
from durable_tasks.reaper import Reaper
from durable_tasks.records import attempts_table, outbox_table, tasks_table
from durable_tasks.store import retention
from tests.helpers import submit, submit_all, wait_until

pytestmark = pytest.mark.anyio


def count(app: App, table: sa.Table) -> int:
    with app.runtime.store.read_engine.connect() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).where(table.c.namespace == app.settings.namespace)).scalar_one()
        )


def job_app(make_app: Callable[..., App], **settings: Any) -> tuple[App, FrozenClock]:
    """An App on a frozen clock with one task, ``job``."""
    clock = FrozenClock()
    app = make_app(clock=clock, **settings)

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[int], n: int) -> int:
        return n

    return app, clock


async def finish_jobs(app: App, clock: FrozenClock, n: int, *, then: timedelta = timedelta(days=8)) -> None:
    """Run ``n`` jobs to success, then move the clock ``then`` on."""
    submit_all(app, "job", range(n))
    await app.dispatch_once()
    await app.work(max_tasks=n, timeout=timedelta(seconds=10))
    clock.advance(then)


async def test_prune_removes_old_finished_work_only(make_app: Callable[..., App]) -> None:
    app, clock = job_app(make_app)
    await finish_jobs(app, clock, 5)
    pending = submit(app, "job", 99)  # new and not yet dispatched: must survive
    report = app.prune(timedelta(days=7), batch=2)
    assert (report.tasks, report.attempts, report.outbox_rows) == (5, 5, 5)
    assert report.batches >= 3  # bounded: 2 rows per transaction
    assert count(app, tasks_table) == 1
    assert count(app, outbox_table) == 1
    assert count(app, attempts_table) == 0
    assert app.get_task(pending).state == TaskState.PENDING
    assert app.prune(timedelta(days=7)).tasks == 0


def session_id(session: Session) -> int:
    """The server's id of the session's connection (PostgreSQL's backend pid, MySQL's thread id)."""
    sql = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
    return int(session.execute(sa.text(sql[session.get_bind().dialect.name])).scalar_one())


def waiting_for(app: App, holder: int) -> int:
    """Transactions waiting now for a row lock the session ``holder`` (a :func:`session_id`) holds.

    MariaDB's ``innodb_trx`` and ``innodb_lock_waits`` did not always list a waiting DELETE (the
    test then waited its 30 s), and its InnoDB monitor, which does, names no holder: there it
    counts waits on a table of this test's database, which only the prune and the rerun use.
    """
    with app.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            sql = "SELECT count(*) FROM pg_stat_activity WHERE :holder = ANY(pg_blocking_pids(pid))"
            return int(conn.execute(sa.text(sql), {"holder": holder}).scalar_one())
        table = f"of table `{conn.execute(sa.text('SELECT DATABASE()')).scalar_one()}`."
        monitor = conn.execute(sa.text("SHOW ENGINE INNODB STATUS")).one()[2]
        return sum("LOCK WAIT" in trx and table in trx for trx in monitor.split("---TRANSACTION")[1:])


async def test_a_prune_passes_by_a_task_a_rerun_is_bringing_back(make_app: Callable[..., App]) -> None:
    """A rerun's uncommitted transaction holds its task's row: the prune does not delete the task
    it brings back, nor the rerun's new outbox row (the dispatcher's, to deliver it)."""
    app, clock = job_app(make_app)
    if app.engine.dialect.name == "sqlite":
        pytest.skip("SQLite's writers take turns: a prune and a rerun never overlap")
    await finish_jobs(app, clock, 3)
    with app.runtime.store.read_engine.connect() as conn:
        ids = tasks_table.c.id
        held, *others = conn.execute(sa.select(ids).where(tasks_table.c.namespace == app.settings.namespace)).scalars()
    reports: list[retention.PruneReport] = []

    def prune() -> None:
        # One row a batch: on MySQL a DELETE by a list of ids over these few rows scans them
        # all, and would wait on the rerun's new outbox row before the prune reads a task.
        reports.append(app.prune(timedelta(days=7), batch=1, paced=False))

    pruner = threading.Thread(target=prune, daemon=True)
    with Session(app.engine) as session:
        app.rerun(session, held)
        rerun = session_id(session)
        pruner.start()
        # Until the prune is over, or waits for a lock the rerun holds.
        await wait_until(lambda: reports or waiting_for(app, rerun), what="the prune to finish or wait for the rerun")
        session.commit()
    pruner.join(30)
    assert reports[0].tasks == len(others)
    assert app.get_task(held).state == TaskState.PENDING
    assert count(app, outbox_table) == 1  # the rerun's delivery


async def test_with_retention_set_the_reaper_prunes_by_itself(make_app: Callable[..., App]) -> None:
    app, clock = job_app(make_app, retention="7d", reaper_interval=timedelta(milliseconds=50))
    assert app.settings.retention == timedelta(days=7)
    await finish_jobs(app, clock, 3, then=timedelta(days=6))
    recent = submit(app, "job", 98)  # finished one day before the cutoff: kept
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    clock.advance(timedelta(days=2))
    pending = submit(app, "job", 99)  # not yet dispatched: never pruned
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(dispatcher=False, worker=False, reaper=True, scheduler=False, stop=stop))
        await wait_until(lambda: count(app, tasks_table) == 2, what="the reaper's retention pass")
        stop.set()
    assert app.get_task(recent).state == TaskState.SUCCEEDED
    assert app.get_task(pending).state == TaskState.PENDING
    assert count(app, attempts_table) == 1


async def test_a_paced_prune_pauses_between_batches_for_its_duty(make_app: Callable[..., App]) -> None:
    app, clock = job_app(make_app)
    await finish_jobs(app, clock, 5)
    pauses: list[float] = []
    before = clock() - timedelta(days=7)
    engine, ns = app.runtime.store.engine, app.settings.namespace
    report = retention.prune(engine, ns, before=before, batch=2, max_batches=100, duty=0.25, sleep=pauses.append)
    assert report.tasks == 5
    assert len(pauses) == report.batches - 1  # between batches, none after the last
    assert all(pause > 0 for pause in pauses)
    unpaced: list[float] = []
    await finish_jobs(app, clock, 3)
    before = clock() - timedelta(days=7)
    assert retention.prune(engine, ns, before=before, batch=1, max_batches=100, sleep=unpaced.append).tasks == 3
    assert unpaced == []


@pytest.mark.parametrize("paced", [True, False])
async def test_an_unpaced_prune_runs_its_batches_back_to_back(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch, paced: bool
) -> None:
    """``durable-tasks prune --no-pause`` (``paced=False``): for an operator who knows no worker
    runs; otherwise a quarter of the time on every backend (on SQLite for the write lock, on
    the others for the CPU the workers need)."""
    app, clock = job_app(make_app)
    await finish_jobs(app, clock, 3)
    duties: list[float] = []
    real = retention.prune

    def recorded(*args: Any, duty: float = 1.0, **kwargs: Any) -> retention.PruneReport:
        duties.append(duty)
        return real(*args, duty=duty, **kwargs)

    monkeypatch.setattr(retention, "prune", recorded)
    assert app.prune(timedelta(days=7), batch=1, paced=paced).tasks == 3
    assert duties == [0.25 if paced else 1.0]


async def test_a_stopped_reaper_waits_for_its_batch_in_progress_not_for_the_pass(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retention pass runs a batch per thread hop: cancelled (the reaper stopping) while a
    batch runs, it ends when that batch commits; the batches it had left do not run."""
    app, clock = job_app(make_app, retention="7d")
    await finish_jobs(app, clock, 6)
    monkeypatch.setattr(reaper_module, "_PRUNE_BATCH", 2)
    store = app.runtime.store
    real = store.prune
    first_done = anyio.Event()

    def batch(*args: Any, **kwargs: Any) -> retention.PruneReport:
        report = real(*args, **kwargs)
        anyio.from_thread.run_sync(first_done.set)
        return report

    monkeypatch.setattr(store, "prune", batch)
    async with anyio.create_task_group() as tg:
        tg.start_soon(Reaper(app.runtime).prune_once)
        await first_done.wait()
        tg.cancel_scope.cancel()
    assert count(app, tasks_table) == 4  # one batch of two; a pass of 20 would have taken all six
    assert (await Reaper(app.runtime).prune_once()).tasks == 4  # the next pass takes the rest


def test_the_pause_gives_a_batch_its_share_of_the_time() -> None:
    assert retention.pause_after(0.2, 1.0) == 0.0
    held, pause = 0.2, retention.pause_after(0.2, 0.25)
    assert held / (held + pause) == pytest.approx(0.25)


def test_the_pause_never_brings_the_prune_below_its_minimum_rate() -> None:
    """A quarter of the time alone would hold a batch of 1,000 that took 0.4 s to 625 rows/s; the
    floor of 2,000 rows/s shortens the pause to 0.1 s. A batch that is fast enough keeps its
    share's pause, and one slower than the floor gets none."""
    assert retention.pause_after(0.4, 0.25, rows=1000, min_rate=2000) == pytest.approx(0.1)
    assert retention.pause_after(0.4, 0.25, rows=1000) == pytest.approx(1.2)  # no floor
    assert retention.pause_after(0.1, 0.25, rows=1000, min_rate=2000) == pytest.approx(0.3)
    assert retention.pause_after(0.6, 0.25, rows=1000, min_rate=2000) == 0.0


async def test_a_paced_prune_keeps_to_the_minimum_rate_setting(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``App.prune`` and the reaper's retention pass both pace with ``retention_min_rate``, and
    count each batch's tasks."""
    app, clock = job_app(make_app, retention="7d", retention_min_rate=1234.0)
    await finish_jobs(app, clock, 6)
    asked: list[tuple[int, float]] = []
    real = retention.pause_after

    def recorded(held: float, duty: float, *, rows: int = 0, min_rate: float = 0.0) -> float:
        asked.append((rows, min_rate))
        return real(held, duty, rows=rows, min_rate=min_rate)

    monkeypatch.setattr(retention, "pause_after", recorded)
    monkeypatch.setattr(reaper_module, "pause_after", recorded)
    assert app.prune(timedelta(days=7), batch=2, max_batches=2).tasks == 4
    assert asked == [(2, 1234.0)]  # one pause, between the two batches
    asked.clear()
    monkeypatch.setattr(reaper_module, "_PRUNE_BATCH", 1)
    assert (await Reaper(app.runtime).prune_once()).tasks == 2
    assert asked == [(1, 1234.0)] * 2  # after each full batch; the third found nothing


async def retention_finding(app: App) -> Finding:
    return {f.check: f for f in diagnose(await gather_facts(app))}["retention"]


async def test_doctor_warns_while_final_tasks_outlive_the_retention(make_app: Callable[..., App]) -> None:
    """Final tasks left more than an hour past DT_RETENTION mean that no reaper prunes, or that
    its prune is slower than tasks finish: doctor warns, naming the setting to raise, until a
    prune deletes them. Pending work and recent final tasks never make it warn."""
    app, clock = job_app(make_app, retention="7d")
    submit(app, "job", 99)  # pending, created now: never counted
    assert (await retention_finding(app)).level is Level.OK  # no final task yet
    await finish_jobs(app, clock, 3, then=timedelta(days=7, minutes=30))
    assert (await retention_finding(app)).level is Level.OK  # half an hour past: a reaper's pass away
    clock.advance(timedelta(hours=1, minutes=30))
    behind = await retention_finding(app)
    assert behind.level is Level.WARNING
    assert "2.0 h past DT_RETENTION" in behind.message
    assert "DT_RETENTION_MIN_RATE (2000 tasks/s)" in behind.message
    assert app.prune(timedelta(days=7)).tasks == 3
    assert (await retention_finding(app)).level is Level.OK


async def test_doctor_says_how_old_final_tasks_are_with_retention_off(make_app: Callable[..., App]) -> None:
    app, clock = job_app(make_app)
    await finish_jobs(app, clock, 1, then=timedelta(days=30))
    off = await retention_finding(app)
    assert off.level is Level.OK
    assert off.message == "DT_RETENTION is off; the oldest final task is 720.0 h old"


def test_a_reaper_interval_over_half_an_hour_widens_what_doctor_allows(make_app: Callable[..., App]) -> None:
    """A reaper prunes once an interval: doctor allows two of them past DT_RETENTION, at least an hour."""
    app = make_app(retention="1d", reaper_interval=timedelta(hours=2))
    now = app.clock()

    def level(finished_ago: timedelta) -> Level:
        return check_retention(Facts(app.settings, {}, {}, now, now, None, oldest_final=now - finished_ago)).level

    assert level(timedelta(days=1, hours=3)) is Level.OK
    assert level(timedelta(days=1, hours=5)) is Level.WARNING
    assert check_retention(Facts(app.settings, {}, {}, now, now, None)).level is Level.OK  # no final task
