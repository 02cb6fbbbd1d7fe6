"""The store on SQLite: one machine, WAL, ``synchronous=FULL``, writers serialized.

Every writing transaction opens with ``BEGIN IMMEDIATE``, so it takes the write lock up front
(two deferred transactions that both upgrade to writing would deadlock); read-only work opens
with a plain ``BEGIN``. Writers being serialized, no row lock order is needed. Dispatchers
poll: SQLite has no notification channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from ..records import tasks_table
from .base import SqlStore
from .engine import READ_ONLY
from .submit import NewTask, insert_outbox, task_row

__all__ = ["SqliteStore"]

#: A new task, or nothing where its idempotency key is taken (built once, as the outbox row's
#: insert is: :mod:`.submit`). RETURNING, not rowcount: drivers disagree on rowcount for ON
#: CONFLICT DO NOTHING.
_INSERT_TASKS = sqlite.insert(tasks_table).on_conflict_do_nothing(
    index_elements=["namespace", "name", "idempotency_key"]
)
_INSERT_TASK = _INSERT_TASKS.returning(tasks_table.c.id)


class SqliteStore(SqlStore):
    """:class:`~.protocol.Store` on a SQLite file."""

    insert_ignores_taken_keys = True  # _INSERT_TASK: ON CONFLICT DO NOTHING

    @classmethod
    def open(cls, url: sa.URL) -> SqliteStore:
        """A store on the SQLite database at ``url`` (its directory must exist)."""
        return cls(_create_engine(url))

    @classmethod
    def in_directory(cls, data_dir: Path) -> SqliteStore:
        """The zero-configuration default: ``durable_tasks.sqlite3`` in ``data_dir``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls.open(sa.make_url(f"sqlite:///{(data_dir / 'durable_tasks.sqlite3').resolve()}"))

    def _insert_task(self, conn: sa.Connection, task: NewTask, task_id: str, now: datetime, *, aside: bool) -> bool:
        if conn.execute(_INSERT_TASK, task_row(task, task_id, now, aside=aside)).first() is None:
            return False
        insert_outbox(conn, task.namespace, task_id, task.queue, 0, 0, task.shadow, now, due=task.due)
        return True

    def _insert_tasks(self, conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            conn.execute(_INSERT_TASKS, rows)  # one prepared statement, stepped per row


def _create_engine(url: sa.URL) -> sa.Engine:
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

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
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return engine
