"""Engine construction: SQLite durability pragmas and transaction mode, Postgres driver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

__all__ = ["create_engine", "is_postgres", "read_only"]

#: Execution option that opens a SQLite transaction with plain BEGIN (readers only).
_SQLITE_READ = "dt_sqlite_read"


def create_engine(database_url: str | None, data_dir: Path) -> sa.Engine:
    """An engine for ``database_url``, or a SQLite file in ``data_dir`` when it is None."""
    if database_url is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        database_url = f"sqlite:///{(data_dir / 'durable_tasks.sqlite3').resolve()}"
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    if url.get_backend_name() == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        _configure_sqlite(engine)
        return engine
    return sa.create_engine(url)


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
