"""Engine construction: SQLite durability pragmas and transaction mode, Postgres driver."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

__all__ = [
    "RUNTIME_SESSION_SQL",
    "create_engine",
    "execute_alone",
    "is_postgres",
    "read_only",
    "runtime_plans",
    "wrapped_error",
]

#: Execution option that opens a SQLite transaction with plain BEGIN (readers only).
_SQLITE_READ = "dt_sqlite_read"

#: A pooled Postgres connection idle this long is pinged before it is handed out.
PING_IF_IDLE_S = 1.0

#: Execution option marking the runtime's own transactions on the application's pool.
_RUNTIME_PLANS = "dt_runtime_plans"

#: The planner setting of every runtime statement on PostgreSQL: run once on each of the
#: loops' own connections as it opens (store.aio), and as SET LOCAL at the start of each of the
#: runtime's transactions on the application's pool (:func:`runtime_plans`), whose connections
#: thus keep their own settings.
#: Every runtime statement finds its rows by key or through an index (arrays of ids,
#: ix_dt_outbox_pending, ix_dt_tasks_state), and a prepared statement keeps the generic plan it
#: got when psycopg prepared it, until the next ANALYZE. A queue's tables are small when its
#: processes start (a new deployment, a new namespace, the benchmark's fresh schema): the
#: planner then preferred sequential scans, and the lease and the mark-SENT went on scanning
#: all of dt_outbox and dt_tasks on every pass as the tables grew (`bench_dt latency`, 200
#: tasks/s: 60 million dt_tasks rows read by sequential scans in 5,600 tasks, the commit ->
#: commit p50 2.2 -> 4.6 ms from the first quarter of an 8,000-task run to the last;
#: docs/performance.md, seventh round). With sequential scans priced out, the keyed plan is the
#: cheapest on any table size, with or without statistics. A SET rather than a startup
#: ``options`` parameter: poolers such as PgBouncer refuse (or drop) that parameter.
_RUNTIME_PLANNER_SETTING = "enable_seqscan = off"
RUNTIME_SESSION_SQL = f"SET {_RUNTIME_PLANNER_SETTING}"
_RUNTIME_TRANSACTION_SQL = f"SET LOCAL {_RUNTIME_PLANNER_SETTING}"


def create_engine(database_url: str | None, data_dir: Path) -> sa.Engine:
    """An engine for ``database_url``, or a SQLite file in ``data_dir`` when it is None."""
    if database_url is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        database_url = f"sqlite:///{(data_dir / 'durable_tasks.sqlite3').resolve()}"
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        engine = sa.create_engine(url, pool_size=10, max_overflow=20)
        _ping_when_idle(engine)
        _plan_runtime_transactions(engine)
        return engine
    if url.get_backend_name() == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        _configure_sqlite(engine)
        return engine
    return sa.create_engine(url)


def runtime_plans(engine: sa.Engine) -> sa.Engine:
    """The same engine and pool, for the runtime's own transactions: on PostgreSQL each starts
    with ``SET LOCAL enable_seqscan = off`` (see :data:`RUNTIME_SESSION_SQL`), which ends with
    the transaction; the application's transactions on the pool never see it."""
    return engine.execution_options(**{_RUNTIME_PLANS: True})


def _plan_runtime_transactions(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        if conn.get_execution_options().get(_RUNTIME_PLANS):
            # On the driver's connection: psycopg opens the transaction with this statement.
            driver = conn.connection.driver_connection
            assert driver is not None
            try:
                driver.execute(_RUNTIME_TRANSACTION_SQL)
            except conn.dialect.loaded_dbapi.Error as exc:  # as from any statement: never reused
                conn.invalidate()
                raise wrapped_error(conn.dialect, _RUNTIME_TRANSACTION_SQL, {}, exc, invalidated=True) from exc


def _ping_when_idle(engine: sa.Engine) -> None:
    """Ping a pooled connection before reuse only if it sat idle for ``PING_IF_IDLE_S``.

    ``pool_pre_ping`` pings on every checkout: one more round trip for every transaction,
    and on a busy machine each round trip waits to be scheduled at both ends. A connection
    back in the pool within the last second was alive then; one that fails anyway raises a
    disconnect error, which makes SQLAlchemy invalidate the whole pool, and every caller of a
    hot path treats a database error as transient (the entry stays pending, the row keeps its
    lease). A dead idle connection is replaced before use: the pool retries the checkout.
    """

    @sa.event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["dt_idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("dt_idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_IF_IDLE_S:
            return  # new, or back in the pool a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise sa.exc.DisconnectionError(f"pooled connection is dead: {exc}") from exc
        if not alive:
            raise sa.exc.DisconnectionError("pooled connection is dead")


def _configure_sqlite(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # The sqlite3 module's own transaction handling would BEGIN lazily as DEFERRED; we
        # issue BEGIN ourselves so that writers take the lock up front (no upgrade deadlock).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL can lose committed submissions on power loss; FULL cannot.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        if conn.get_execution_options().get(_SQLITE_READ):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_postgres(bind: sa.Engine | sa.Connection) -> bool:
    """Whether the bind talks to PostgreSQL."""
    return bind.dialect.name == "postgresql"


def read_only(engine: sa.Engine) -> sa.Engine:
    """The same engine, opening SQLite transactions without the write lock."""
    return engine.execution_options(**{_SQLITE_READ: True})


def execute_alone(engine: sa.Engine, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run ONE statement on a pooled PostgreSQL connection as its own transaction (autocommit)
    and return its rows as plain tuples.

    For the hot paths that run one statement a call (a dispatcher's lease and mark-SENT, a
    worker's batch claim and group commit): psycopg would send BEGIN, the statement and COMMIT,
    three round trips; alone, the statement commits as it ends, with the same atomicity. It
    goes to psycopg directly, past SQLAlchemy's Connection, isolation-level switching and
    result layers, which cost about 250 µs of CPU a call, a fifth of a one-row dispatch pass on
    the benchmark machine. The pool, its checkout ping and its events are kept. Errors come out
    as SQLAlchemy's DBAPIError family, as from a Connection (every caller handles those as an
    outage); the connection an error came from is discarded rather than checked for health.
    """
    dialect = engine.dialect
    dbapi_error: type[Exception] = dialect.loaded_dbapi.Error
    try:
        pooled = engine.raw_connection()
    except dbapi_error as exc:
        raise wrapped_error(dialect, statement, params, exc, invalidated=False) from exc
    back_to_transactional = False
    try:
        driver = pooled.driver_connection
        assert driver is not None
        driver.autocommit = True
        with driver.cursor() as cursor:
            # Planned on each call (never prepared): in autocommit there is no transaction for
            # SET LOCAL (see RUNTIME_SESSION_SQL), and a generic plan made while the tables were
            # small would be kept as they grew.
            cursor.execute(statement, params, prepare=False)
            rows: list[tuple[Any, ...]] = cursor.fetchall() if cursor.description else []
        driver.autocommit = False  # the pool's next borrower expects a transactional connection
        back_to_transactional = True
        return rows
    except dbapi_error as exc:
        raise wrapped_error(dialect, statement, params, exc, invalidated=True) from exc
    finally:
        if not back_to_transactional:  # failed, or interrupted: never reuse it in autocommit
            pooled.invalidate()
        pooled.close()


def wrapped_error(
    dialect: sa.Dialect, statement: str, params: Mapping[str, Any], exc: Exception, *, invalidated: bool
) -> sa.exc.StatementError:
    """A driver error as SQLAlchemy's Connection would raise it (the DBAPIError family)."""
    return sa.exc.DBAPIError.instance(
        statement,
        dict(params),
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=invalidated,
        dialect=dialect,
    )
