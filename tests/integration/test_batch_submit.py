"""submit_many and asubmit: the same intents as single submits, in the caller's transaction;
one round trip per batch on PostgreSQL; SQLAlchemy's and SQLModel's AsyncSession."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlmodel import Session
from sqlmodel.ext.asyncio.session import AsyncSession as SQLModelAsyncSession

from durable_tasks import App
from durable_tasks.errors import PayloadError, PayloadValidationError
from durable_tasks.records import tasks_table
from tests.helpers import doubling_app, reads_tasks, run_until_quiet, statements_on

pytestmark = pytest.mark.anyio


def task_count(app: App) -> int:
    t = tasks_table.c
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(t.namespace == app.settings.namespace)).scalar_one())


async def test_submit_many_writes_every_task_in_order_and_they_run(make_app: Callable[..., App]) -> None:
    app = doubling_app(make_app)
    double = app.registry["double"]
    with Session(app.engine) as session:
        handles = double.submit_many(session, [(i, f"k{i}") for i in range(100)])
        session.commit()
    assert [h.created for h in handles] == [True] * 100
    assert len({h.id for h in handles}) == 100
    await run_until_quiet(app)
    assert [h.result(timeout=30) for h in handles[:3]] == [0, 2, 4]
    assert app.get_task(handles[99].id).result == 198
    await app.aclose()


async def test_submit_many_resolves_duplicate_keys_like_single_submits(make_app: Callable[..., App]) -> None:
    app = doubling_app(make_app)
    double = app.registry["double"]
    with Session(app.engine) as session:
        committed = double.submit(session, 1, idempotency_key="old")
        session.commit()
    with Session(app.engine) as session:
        earlier = double.submit(session, 2, idempotency_key="same-transaction")
        handles = double.submit_many(
            session,
            [(1, "old"), (2, "same-transaction"), (3, "twice"), (3, "twice"), (4, None), (4, None)],
        )
        session.commit()
    old, same, first, second, free1, free2 = handles
    assert (old.id, old.created) == (committed.id, False)
    assert (same.id, same.created) == (earlier.id, False)
    assert first.created
    assert (second.id, second.created) == (first.id, False)
    assert free1.created
    assert free2.created
    assert free1.id != free2.id
    assert task_count(app) == 5  # old, same-transaction, twice and the two without a key
    await app.aclose()


async def test_submit_many_with_one_bad_item_writes_nothing(make_app: Callable[..., App]) -> None:
    app = doubling_app(make_app)
    double = app.registry["double"]
    with Session(app.engine) as session:
        with pytest.raises(PayloadValidationError):
            double.submit_many(session, [(1, None), ("not a number", None), (3, None)])
        with pytest.raises(PayloadError, match="pair"):
            double.submit_many(session, [(1, None), 2])  # type: ignore[list-item]
        session.commit()
    assert task_count(app) == 0
    await app.aclose()


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
async def test_submit_many_is_a_few_statements_whatever_its_size(make_app: Callable[..., App], keyed: bool) -> None:
    """PostgreSQL: one statement. SQLite: the tasks' insert, the read back of their keys, the
    outbox rows' insert. MySQL looks the keys up before that insert too (its insert of a taken
    key locks the row that holds it)."""
    app = doubling_app(make_app)
    double = app.registry["double"]
    with Session(app.engine) as session:
        session.connection()  # the transaction is open: what follows is the batch alone
        with statements_on(app.engine) as seen:
            handles = double.submit_many(session, [(i, f"k{i}" if keyed else None) for i in range(500)])
        session.commit()
    expected = {"postgresql": (1, 1), "sqlite": (3, 2), "mysql": (4, 2)}[app.engine.dialect.name]
    assert len(seen) == expected[0 if keyed else 1], seen
    assert all(h.created for h in handles)
    assert task_count(app) == 500
    await app.aclose()


async def test_submit_many_resolves_a_key_as_the_database_compares_it(make_app: Callable[..., App]) -> None:
    """A key names the task the database's unique index matches it to, as a single submit
    finds it: MySQL's collation pads trailing spaces ("k " is the task of "k"), the others
    compare the strings."""
    app = doubling_app(make_app)
    double = app.registry["double"]
    with Session(app.engine) as session:
        held = double.submit(session, 1, idempotency_key="k")
        session.commit()
    with Session(app.engine) as session:
        alone = double.submit(session, 1, idempotency_key="k ")
        session.rollback()
    with Session(app.engine) as session:
        spaced, other = double.submit_many(session, [(1, "k "), (2, "other")])
        session.commit()
    assert spaced.created == alone.created
    assert (spaced.id == held.id) == (not alone.created)
    assert alone.created == (app.engine.dialect.name != "mysql")
    assert other.created
    await app.aclose()


async def test_a_new_keyed_submit_does_not_look_its_key_up_first(make_app: Callable[..., App]) -> None:
    """Where a taken key makes the insert change nothing (PostgreSQL, SQLite), a new key is
    written without a read of dt_tasks (one statement on PostgreSQL); a taken one is read after
    the insert that found it taken. MySQL's insert of a taken key locks that row: it reads first."""
    app = doubling_app(make_app)
    double = app.registry["double"]
    dialect = app.engine.dialect.name
    with Session(app.engine) as session:
        session.connection()  # the transaction is open: what follows is the submit alone
        with statements_on(app.engine) as new:
            first = double.submit(session, 1, idempotency_key="order-1")
        with statements_on(app.engine) as taken:
            again = double.submit(session, 1, idempotency_key="order-1")
        session.commit()
    assert first.created
    assert (again.id, again.created) == (first.id, False)
    assert task_count(app) == 1
    reads_first = [reads_tasks(st) for st in new]
    if dialect == "mysql":
        assert reads_first[0], new
    else:
        assert not any(reads_first), new
        assert len(new) == (1 if dialect == "postgresql" else 2), new  # the task and its outbox row
        # the insert, the read of the key, then the payload's comparison (a duplicate's own)
        assert [reads_tasks(st) for st in taken] == [False, True, True], taken
    await app.aclose()


@pytest.fixture(params=[AsyncSession, SQLModelAsyncSession], ids=["sqlalchemy", "sqlmodel"])
async def async_session(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[AsyncSession]:
    url = sa.engine.make_url(database_url)
    async_drivers = {"sqlite": "sqlite+aiosqlite", "mysql": "mysql+aiomysql"}
    url = url.set(drivername=async_drivers.get(url.get_backend_name(), url.drivername))
    engine = create_async_engine(url)
    async with request.param(engine) as session:
        yield session
    await engine.dispose()


async def test_asubmit_writes_in_the_async_sessions_transaction(
    make_app: Callable[..., App], async_session: AsyncSession
) -> None:
    app = doubling_app(make_app)
    double = app.registry["double"]
    first = await double.asubmit(async_session, 21, idempotency_key="order-1")
    again = await app.asubmit(async_session, "double", 21, idempotency_key="order-1")
    await async_session.rollback()  # rolled back: no task
    assert task_count(app) == 0
    assert first.created
    assert (again.id, again.created) == (first.id, False)
    kept = await double.asubmit(async_session, 21, idempotency_key="order-1")
    await async_session.commit()
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(run_until_quiet, app))
            assert await kept.wait(timeout=60) == 42
    await app.aclose()
