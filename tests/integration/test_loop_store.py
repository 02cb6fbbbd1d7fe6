"""The Postgres store's own async connections: one statement, its own transaction, no
thread; errors as SQLAlchemy errors; a connection that failed never serves again; a dead idle
one is replaced; a statement once sent finishes even if its caller is cancelled; one loop's
connections never serve another loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext
from durable_tasks.store import engine as engine_module
from durable_tasks.store.postgres import PostgresStore
from durable_tasks.store.postgres.connections import AsyncConnections
from durable_tasks.store.postgres.statements import OneStatement, Rows
from durable_tasks.worker import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
def engine(postgres_url: str) -> Iterator[sa.Engine]:
    store = PostgresStore.open(sa.make_url(postgres_url))
    eng = store.engine
    with eng.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS dt_test_loop_store (v int)")
        conn.exec_driver_sql("TRUNCATE dt_test_loop_store")
    yield eng
    with eng.begin() as conn:
        conn.exec_driver_sql("DROP TABLE dt_test_loop_store")
    store.close()


@pytest.fixture
async def connections(engine: sa.Engine) -> AsyncIterator[AsyncConnections]:
    pool = AsyncConnections(engine)
    yield pool
    pool.close()


def rows(sql: str, **params: object) -> OneStatement[Rows]:
    return OneStatement(sql, params, list)


def backend_pid() -> OneStatement[int]:
    return OneStatement("SELECT pg_backend_pid()", {}, lambda r: int(r[0][0]))


def committed_values(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.exec_driver_sql("SELECT v FROM dt_test_loop_store ORDER BY v").scalars())


def terminate(engine: sa.Engine, pid: int) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid}, 5000)").scalar_one()


async def test_a_statement_commits_alone_and_its_rows_are_read_by_its_reader(
    connections: AsyncConnections, engine: sa.Engine
) -> None:
    inserted = OneStatement(
        "INSERT INTO dt_test_loop_store SELECT unnest(%(vs)s::int[]) RETURNING v",
        {"vs": [3, 1, 2]},
        lambda r: sorted(v for (v,) in r),
    )
    assert await connections.run(inserted) == [1, 2, 3]
    assert committed_values(engine) == [1, 2, 3]  # seen from another connection: committed
    first = await connections.run(backend_pid())
    assert await connections.run(backend_pid()) == first  # the connection is reused


async def test_errors_are_sqlalchemy_errors_and_the_connection_is_not_reused(
    connections: AsyncConnections, engine: sa.Engine
) -> None:
    """The loops treat SQLAlchemyError as an outage (entries stay pending, rows keep their
    lease): a bad statement and a dead connection both come out as one."""
    first = await connections.run(backend_pid())
    with pytest.raises(sa.exc.ProgrammingError):
        await connections.run(rows("SELECT no_such_column FROM pg_class"))
    second = await connections.run(backend_pid())
    assert second != first
    terminate(engine, second)
    with pytest.raises(sa.exc.OperationalError) as raised:  # reused at once: no ping, it fails
        await connections.run(rows("SELECT 1"))
    assert raised.value.connection_invalidated
    assert await connections.run(rows("SELECT 1")) == [(1,)]  # a new connection


async def test_a_dead_idle_connection_is_replaced_before_use(
    connections: AsyncConnections, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await connections.run(backend_pid())
    terminate(engine, first)
    monkeypatch.setattr(engine_module, "PING_IF_IDLE_S", 0.0)
    assert await connections.run(backend_pid()) != first  # no error reached the caller


async def test_a_statement_sent_finishes_when_its_caller_is_cancelled(
    connections: AsyncConnections, engine: sa.Engine
) -> None:
    """As a statement in a worker thread did: the caller's cancellation waits for the outcome,
    so a claim or commit never ends in an unknown state on a connection still in use."""
    await connections.run(rows("SELECT 1"))  # connected: the cancellation below finds the statement sent
    slow = rows("INSERT INTO dt_test_loop_store SELECT 7 FROM pg_sleep(0.3) RETURNING v")
    got: Rows = []
    with anyio.move_on_after(0.05) as scope:
        got = await connections.run(slow)
    assert scope.cancel_called
    assert got == [(7,)]
    assert committed_values(engine) == [7]
    assert await connections.run(rows("SELECT 1")) == [(1,)]  # and its connection serves again


def test_a_loop_never_uses_the_connections_of_a_finished_loop(engine: sa.Engine) -> None:
    """The store keeps one set of connections per event loop; a new loop gets new connections
    and the old loop's idle ones are closed."""
    app = App(engine.url.render_as_string(hide_password=False), "redis://127.0.0.1:1/0", "loopstore")
    store = app.runtime.store
    assert isinstance(store, PostgresStore)
    seen: list[tuple[AsyncConnections, int]] = []

    async def use() -> None:
        seen.append((store.connections, await store.connections.run(backend_pid())))

    anyio.run(use)
    anyio.run(use)
    (first, first_pid), (second, second_pid) = seen
    assert second is not first
    assert second_pid != first_pid
    assert first.idle == 0  # closed when the second loop took over
    anyio.run(app.aclose)


async def test_the_dispatcher_and_worker_send_their_statements_on_the_loops_connections(app: App) -> None:
    """On PostgreSQL the lease, mark-SENT, claim and group commit go through the event loop's
    own connections (none of them through a thread); on SQLite there are none to use."""

    @app.task(name="loop-store.double", queue="jobs")
    async def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    with Session(app.engine) as s:
        task_id = app.submit(s, "loop-store.double", 21).id
        s.commit()
    assert await app.dispatch_once() == 1
    assert await Worker(app.runtime).run(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).result == 42
    store = app.runtime.store
    if isinstance(store, PostgresStore):
        assert store.connections.idle >= 1  # used, and kept for the next statement
