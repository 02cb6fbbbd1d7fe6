"""One lock order for every multi-row write of ``dt_tasks``: ascending id.

Claims, marks, lease renewals and group commits each update many task rows in one statement.
Without a common order two of them can lock the same rows in opposite orders and deadlock
(the chaos harness saw it under load). Each of them therefore selects its rows ``ORDER BY id
FOR UPDATE`` in a subquery first; SQLite, which serializes writers, just gets the subquery.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..records import tasks_table
from .engine import is_postgres

__all__ = ["lock_tasks_in_order", "task_rows_in_order"]

t = tasks_table.c


def task_rows_in_order(conn: sa.Connection, *conditions: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """``dt_tasks.id IN (rows matching conditions, locked in id order)`` for an UPDATE's WHERE."""
    rows = sa.select(t.id).where(*conditions).order_by(t.id)
    if is_postgres(conn):
        rows = rows.with_for_update()
    return t.id.in_(rows.scalar_subquery())


def lock_tasks_in_order(conn: sa.Connection, task_ids: list[str]) -> None:
    """Lock these task rows up front, in id order (Postgres), before a transaction that
    updates them in several statements."""
    if task_ids and is_postgres(conn):
        conn.execute(sa.select(t.id).where(t.id.in_(task_ids)).order_by(t.id).with_for_update()).all()
