"""PostgreSQL as it is deployed: behind PgBouncer (Debian's, 1.18) in transaction mode.

Each test module run gets a database of its own and a PgBouncer of its own in front of it
(tests/pgbouncer.py); without pgbouncer installed these tests skip, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext
from durable_tasks.doctor import Level, check_listen, check_pooler, gather_pooling
from durable_tasks.store.pooler import Pooling
from durable_tasks.store.postgres.notify import PostgresNotifyWaiter
from tests.conftest import FAST
from tests.pgbouncer import MISSING, PgBouncer, pgbouncer, pgbouncer_binary, scratch_database
from tests.servers import server_home

pytestmark = pytest.mark.anyio


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
    pooling, reaches = await gather_pooling(pooled)
    assert pooling is not None
    assert pooling.pooling is Pooling.TRANSACTION, pooling
    assert reaches is False
    with_listener = pooled_app(listen_database_url=direct_url)
    pooling, reaches = await gather_pooling(with_listener)
    assert pooling is not None
    assert pooling.pooling is Pooling.TRANSACTION
    assert reaches is True

    from durable_tasks.doctor import Facts

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
    pooling, reaches = await gather_pooling(app)
    assert pooling is not None
    assert pooling.pooling is Pooling.DIRECT, pooling
    assert reaches is True
    waiter = app.runtime.outbox_waiter()
    try:
        await waiter.wait(timedelta(milliseconds=10))
    finally:
        await waiter.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
