"""PostgreSQL as it is deployed: behind PgBouncer (Debian's, 1.18) in transaction mode.

Each test module run gets a database of its own and a PgBouncer of its own in front of it
(tests/pgbouncer.py); without pgbouncer installed these tests skip, saying why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import anyio
import psycopg
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext
from durable_tasks.doctor import Facts, Level, check_listen, check_pooler
from durable_tasks.errors import ConfigurationError
from durable_tasks.store.pooler import Pooling, PoolingReport, conninfo
from durable_tasks.store.postgres.notify import PostgresNotifyWaiter
from tests.helpers import FAST, turns_true, wait_until
from tests.pgbouncer import MISSING, PgBouncer, pgbouncer, pgbouncer_binary, scratch_database
from tests.servers import server_home

pytestmark = pytest.mark.anyio


async def pooling_of(app: App) -> tuple[PoolingReport | None, bool | None]:
    """What doctor reads of the pooler: what sits between the runtime and PostgreSQL, and
    whether a test NOTIFY sent through the application's URL reaches a LISTEN on the listener's."""
    facts = await app.runtime.store.facts()
    return facts.pooling, facts.listen_reaches


@pytest.fixture(scope="module")
def upstream() -> sa.URL:
    import os

    base = os.environ.get("DT_TEST_DATABASE_URL")
    if not base:
        pytest.skip("PgBouncer tests need the machine's PostgreSQL (DT_TEST_DATABASE_URL)")
    return sa.engine.make_url(base)


@pytest.fixture(scope="module")
def database(upstream: sa.URL) -> Iterator[str]:
    with scratch_database(upstream) as name:
        yield name


@pytest.fixture(scope="module")
def bouncer(upstream: sa.URL, database: str) -> Iterator[PgBouncer]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(MISSING)
    with server_home("pgbouncer") as home, pgbouncer(binary, home, upstream, database) as running:
        yield running


@pytest.fixture(scope="module")
def direct_url(upstream: sa.URL, database: str) -> str:
    """The pooled database, reached without the pooler."""
    return upstream.set(drivername="postgresql+psycopg", database=database).render_as_string(hide_password=False)


@pytest.fixture
def pooled_app(bouncer: PgBouncer, redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def build(**overrides: Any) -> App:
        settings: dict[str, Any] = FAST | {"listen_check_timeout": timedelta(milliseconds=500)} | overrides
        app = App(bouncer.url, redis_url, namespace, data_dir=tmp_path, **settings)
        app.create_all()
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.engine.dispose()


def noop_task(app: App) -> Callable[[], str]:
    @app.task(name="pooler.noop", queue="jobs")
    def noop(ctx: TaskContext[int], n: int) -> int:
        return n

    def submit() -> str:
        with Session(app.engine) as s:
            task_id = noop.submit(s, 1).id
            s.commit()
        return task_id

    return submit


async def test_behind_a_transaction_pooler_the_dispatcher_says_once_that_notify_is_lost_and_polls(
    pooled_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    app = pooled_app()
    waiter = app.runtime.outbox_waiter()
    assert isinstance(waiter, PostgresNotifyWaiter)
    try:
        for _ in range(3):
            await waiter.wait(timedelta(milliseconds=50))
    finally:
        await waiter.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "polling the outbox every 0.1 s" in warnings[0]
    assert "DT_LISTEN_DATABASE_URL" in warnings[0]


async def test_a_direct_listen_url_wakes_the_dispatcher_at_each_submit_through_the_pooler(
    pooled_app: Callable[..., App], direct_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = pooled_app(listen_database_url=direct_url)
    submit = noop_task(app)
    waiter = app.runtime.outbox_waiter()
    woken = anyio.Event()

    async def wait_once() -> None:
        await waiter.wait(timedelta(minutes=5))  # only a NOTIFY ends this before the test's deadline
        woken.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_once)
            with anyio.fail_after(60):
                while not woken.is_set():  # the listener checks itself first; a submit then wakes it
                    submit()
                    with anyio.move_on_after(1):
                        await woken.wait()
    finally:
        await waiter.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_doctor_tells_a_transaction_pooler_and_a_lost_notify_apart_from_a_direct_connection(
    pooled_app: Callable[..., App], direct_url: str
) -> None:
    pooled = pooled_app()
    pooling, reaches = await pooling_of(pooled)
    assert pooling is not None
    assert pooling.pooling is Pooling.TRANSACTION, pooling
    assert reaches is False
    with_listener = pooled_app(listen_database_url=direct_url)
    pooling, reaches = await pooling_of(with_listener)
    assert pooling is not None
    assert pooling.pooling is Pooling.TRANSACTION
    assert reaches is True

    def finding(check: Callable[[Facts], Any], app: App, pooling: Any, reaches: bool) -> Any:
        facts = Facts(app.settings, {}, {}, app.clock(), app.clock(), None)
        facts.pooling, facts.listen_reaches = pooling, reaches
        return check(facts)

    lost = finding(check_listen, pooled, pooling, False)
    assert lost.level is Level.WARNING
    assert "DT_LISTEN_DATABASE_URL" in lost.message
    assert finding(check_pooler, pooled, pooling, False).level is Level.WARNING
    assert "transaction mode" in finding(check_pooler, pooled, pooling, False).message
    assert finding(check_pooler, with_listener, pooling, True).level is Level.OK


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_on_a_direct_connection_doctor_sees_no_pooler_and_notify_arrives(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    pooling, reaches = await pooling_of(app)
    assert pooling is not None
    assert pooling.pooling is Pooling.DIRECT, pooling
    assert reaches is True
    waiter = app.runtime.outbox_waiter()
    try:
        await waiter.wait(timedelta(milliseconds=10))
    finally:
        await waiter.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class SettingsSampler:
    """An unrelated client of the same pool: reads ``enable_seqscan`` and ``synchronous_commit``
    (the two settings the runtime changes for its own statements) statement after statement,
    each of which may land on any server connection the runtime used, in a thread."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.samples: dict[str, list[str]] = {"before": [], "during": [], "after": []}
        self.phase = "before"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT current_setting('enable_seqscan') || ' ' || current_setting('synchronous_commit')"
                ).fetchone()
                assert row is not None
                self.samples[self.phase].append(str(row[0]))
                self._stop.wait(0.005)

    def start(self) -> None:
        self._thread.start()

    def sample_until(self, phase: str, count: int) -> None:
        took = turns_true(lambda: len(self.samples[phase]) >= count, timeout=30)
        assert took, f"the sampler took no {count} samples {phase} the run"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


TASKS = 2000


@pytest.mark.timeout(
    300
)  # 2,000 tasks through a pooler of 5 server connections: over a minute on a busy 2-core machine
async def test_through_pgbouncer_each_task_runs_once_and_no_setting_reaches_other_clients(
    pooled_app: Callable[..., App], bouncer: PgBouncer, namespace: str
) -> None:
    """PgBouncer 1.18 in transaction mode, 2,000 tasks: every one executed exactly once
    (executions counted in a business table by the handler), no attempt but the first, and an
    unrelated client of the same pool sees enable_seqscan (and synchronous_commit) on before,
    during and after."""
    app = pooled_app(concurrency=32)
    runs = sa.Table(f"runs_{namespace}", sa.MetaData(), sa.Column("n", sa.Integer, nullable=False))
    runs.create(app.engine)

    @app.task(name="pooler.counted", queue="jobs")
    def counted(ctx: TaskContext[int], n: int) -> int:
        with app.engine.begin() as conn:
            conn.execute(runs.insert().values(n=n))
        return n

    sampler = SettingsSampler(conninfo(sa.engine.make_url(bouncer.url)))
    sampler.start()
    try:
        sampler.sample_until("before", 50)
        sampler.phase = "during"
        started = time.monotonic()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: app.run(stop=stop))
            for first in range(0, TASKS, 100):
                with Session(app.engine) as s:
                    for n in range(first, first + 100):
                        counted.submit(s, n)
                    s.commit()
            await wait_until(lambda: succeeded(app) >= TASKS, timeout=600, what=f"{TASKS} tasks to succeed")
            stop.set()
        took = time.monotonic() - started
        await app.aclose()
        sampler.phase = "after"
        sampler.sample_until("after", 50)
    finally:
        sampler.stop()
    with app.engine.connect() as conn:
        executions: dict[int, int] = dict(conn.execute(sa.select(runs.c.n, sa.func.count()).group_by(runs.c.n)).all())
        attempts = conn.execute(
            sa.text(
                "SELECT count(*), max(attempt) FROM dt_attempts WHERE task_id IN "
                "(SELECT id FROM dt_tasks WHERE namespace = :ns)"
            ),
            {"ns": namespace},
        ).one()
    print(  # the figures the issue asks for; shown with pytest -s
        f"\npgbouncer transaction mode: {TASKS} tasks in {took:.1f} s; executions {sum(executions.values())} "
        f"over {len(executions)} tasks; attempts {attempts[0]} (highest {attempts[1]}); enable_seqscan, "
        "synchronous_commit samples "
        + ", ".join(f"{phase} {len(values)} ({sorted(set(values))})" for phase, values in sampler.samples.items())
    )
    assert sorted(executions) == list(range(TASKS))
    assert {n: c for n, c in executions.items() if c != 1} == {}
    assert tuple(attempts) == (TASKS, 1)
    for phase, values in sampler.samples.items():
        assert values, phase
        assert set(values) == {"on on"}, (phase, {v: values.count(v) for v in set(values)})


def succeeded(app: App) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM dt_tasks WHERE namespace = :ns AND state = 'SUCCEEDED'"),
                {"ns": app.settings.namespace},
            ).scalar_one()
        )


def prepared_after(engine: sa.Engine, runs: int) -> int:
    """How many statements psycopg had prepared on one connection after ``runs`` of the same query."""
    with engine.connect() as conn:
        for n in range(runs):
            conn.exec_driver_sql("SELECT %(n)s::int + 1", {"n": n}).scalar_one()
        return int(conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one())


@pytest.mark.parametrize(
    ("query", "setting", "prepared"),
    [
        ("", "auto", True),  # psycopg's default: prepared on the sixth run
        ("prepare_threshold=0", "auto", True),  # psycopg's 0: at the first
        ("prepare_threshold=off", "auto", False),
        ("prepare_threshold=none", "auto", False),
        ("prepare_threshold=0", "off", False),  # the setting wins over the URL
        ("", "off", False),
    ],
)
def test_prepare_threshold_comes_from_the_url_or_the_setting_on_a_direct_connection(
    direct_url: str, tmp_path: Path, query: str, setting: Literal["auto", "off"], prepared: bool
) -> None:
    url = f"{direct_url}?{query}" if query else direct_url
    app = App(url, "redis://127.0.0.1:1/0", "prep", data_dir=tmp_path, prepare_threshold=setting)
    try:
        assert (prepared_after(app.engine, 8) > 0) is prepared
    finally:
        app.engine.dispose()


def test_a_bad_prepare_threshold_in_the_url_is_a_typed_error(direct_url: str, tmp_path: Path) -> None:
    app = App(f"{direct_url}?prepare_threshold=sometimes", "redis://127.0.0.1:1/0", "prep", data_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="prepare_threshold"):
        _ = app.engine


@pytest.mark.parametrize("query", ["", "?prepare_threshold=0", "?prepare_threshold=5"])
def test_behind_a_transaction_pooler_nothing_is_prepared_whatever_was_asked(
    bouncer: PgBouncer, tmp_path: Path, query: str
) -> None:
    app = App(bouncer.url + query, "redis://127.0.0.1:1/0", "prep", data_dir=tmp_path)
    try:
        assert prepared_after(app.engine, 20) == 0  # and none of the 20 runs failed
    finally:
        app.engine.dispose()
