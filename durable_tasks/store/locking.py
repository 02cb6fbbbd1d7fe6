"""One lock order for every multi-row write of ``dt_tasks``: ascending id.

Claims, marks, lease renewals and group commits each update many task rows at once. Without
a common order two of them can lock the same rows in opposite orders and deadlock (the chaos
harness saw it under load). On PostgreSQL each of them is a named statement
(``sql/postgres.sql``) whose first CTE locks its rows ``ORDER BY id FOR UPDATE``; a group
commit with on-commit hooks, several statements, takes its locks up front here. SQLite
serializes writers and needs neither.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..records import tasks_table
from .engine import is_postgres

__all__ = ["lock_tasks_in_order"]

t = tasks_table.c


def lock_tasks_in_order(conn: sa.Connection, task_ids: list[str]) -> None:
    """Lock these task rows up front, in id order (Postgres), before a transaction that
    updates them in several statements."""
    if task_ids and is_postgres(conn):
        conn.execute(sa.select(t.id).where(t.id.in_(task_ids)).order_by(t.id).with_for_update()).all()
