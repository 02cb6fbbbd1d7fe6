"""On MySQL/MariaDB the group commit closes its attempts, and a prune deletes them, through
ix_dt_attempts_task, and a prune deletes outbox rows through ix_dt_outbox_task_id and journal
steps through uq_dt_steps_slot, whatever the statistics say (durable_tasks.store.planning).

Past ``eq_range_index_dive_limit`` (200) ids an IN list is estimated from the statistics, not
by looking in the index. ``dt_attempts`` grows by every claim, faster than its statistics
follow, and MariaDB planned the close of 512 attempts as a full scan of the primary key: a
1,000,000-task backlog drained at half its pace while the table grew. Here the statistics are
made to mislead on purpose (MariaDB's engine-independent statistics, which its optimizer
prefers: each task id appears to have a thousand attempts) and the statement the runtime
executes is planned again with ``EXPLAIN`` and the same parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from durable_tasks import App
from durable_tasks.records import attempts_table, outbox_table, steps_table
from durable_tasks.store import results, retention
from durable_tasks.store.ids import new_task_id
from durable_tasks.store.results import FinalWrite
from tests.helpers import first_attempt

pytestmark = pytest.mark.parametrize("database_url", ["mysql"], indirect=True)

#: More ids than MariaDB and MySQL look up in the index to estimate an IN list (200).
CLOSED = 300


#: The tables that grow by every claim or submit, each with its index on task id.
BY_TASK = {"dt_attempts": "ix_dt_attempts_task", "dt_outbox": "ix_dt_outbox_task_id", "dt_steps": "uq_dt_steps_slot"}


@contextmanager
def misleading_statistics(engine: sa.Engine, table: str = "dt_attempts") -> Iterator[None]:
    """Statistics by which each task id has a thousand rows in ``table``: scanning the table
    looks cheaper than looking the ids up. Removed after (the database is shared by the tests
    that follow). Skipped on a MySQL server (these statistics are MariaDB's)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        version = str(conn.execute(sa.text("SELECT VERSION()")).scalar_one())
        if "mariadb" not in version.lower():
            pytest.skip(f"engine-independent statistics are MariaDB's; this server is {version}")
        conn.execute(sa.text(f"ANALYZE TABLE {table} PERSISTENT FOR ALL")).all()
        conn.execute(
            sa.text(
                "UPDATE mysql.index_stats SET avg_frequency = 1000 "
                "WHERE db_name = DATABASE() AND table_name = :table AND index_name = :index"
            ),
            {"table": table, "index": BY_TASK[table]},
        )
        conn.execute(sa.text(f"FLUSH TABLES {table}"))
        try:
            yield
        finally:
            for stats in ("table_stats", "column_stats", "index_stats"):
                conn.execute(
                    sa.text(f"DELETE FROM mysql.{stats} WHERE db_name = DATABASE() AND table_name = :table"),
                    {"table": table},
                )
            conn.execute(sa.text(f"FLUSH TABLES {table}"))


def open_attempts(app: App, now: datetime) -> list[str]:
    """CLOSED + 1,700 tasks with an open attempt each (more than the statements touch): their ids."""
    task_ids = [new_task_id() for _ in range(CLOSED + 1700)]
    row = {"namespace": app.settings.namespace, "generation": 0, "attempt": 1, "delivery": 0, "worker_id": "w"}
    with app.engine.begin() as conn:
        conn.execute(sa.insert(attempts_table), [row | {"task_id": task_id, "started_at": now} for task_id in task_ids])
    return task_ids


@contextmanager
def plans_of_statements_on(engine: sa.Engine, table: str) -> Iterator[list[tuple[str, Any]]]:
    """Within misleading statistics of ``table``: the block's statements that read or write it,
    each with its plan (``EXPLAIN`` with the same parameters), listed once the block ends."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if f"{table} " in statement.split(" WHERE ")[0] + " ":
            seen.append((statement, params))

    plans: list[tuple[str, Any]] = []
    with misleading_statistics(engine, table):
        event.listen(engine, "before_cursor_execute", capture)
        try:
            yield plans
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        with engine.connect() as conn:
            for statement, params in seen:
                plans.append((statement, conn.exec_driver_sql(f"EXPLAIN {statement}", params).mappings().one()))


def test_the_group_commit_closes_attempts_by_their_index_whatever_the_statistics_say(make_app: Any) -> None:
    app: App = make_app()
    ns, now = app.settings.namespace, datetime.now(UTC)
    task_ids = open_attempts(app, now)
    writes = [(FinalWrite(first_attempt(ns, task_id, now), "1"), "succeeded") for task_id in task_ids[:CLOSED]]
    with plans_of_statements_on(app.engine, "dt_attempts") as plans, app.engine.begin() as conn:
        results.finish_attempts(conn, writes, now)
    [(statement, plan)] = plans
    assert statement.startswith("UPDATE dt_attempts")
    assert (plan["type"], plan["key"]) == ("range", "ix_dt_attempts_task"), dict(plan)
    with app.engine.connect() as conn:
        closed = conn.execute(
            sa.select(sa.func.count()).where(attempts_table.c.namespace == ns, attempts_table.c.outcome == "succeeded")
        ).scalar_one()
    assert closed == CLOSED


def task_rows(table: str, namespace: str, now: datetime, task_id: str) -> dict[str, Any]:
    """One row of ``table`` for ``task_id``: an open attempt, a sent outbox row, a recorded step."""
    common = {"namespace": namespace, "task_id": task_id, "generation": 0}
    return (
        common
        | {
            "dt_attempts": {"attempt": 1, "delivery": 0, "worker_id": "w", "started_at": now},
            "dt_outbox": {
                "queue": "q",
                "delivery": 0,
                "state": "SENT",
                "attempts": 1,
                "next_attempt_at": now,
                "shadow": False,
                "created_at": now,
            },
            "dt_steps": {"kind": "step", "label": "l", "done": True, "created_at": now, "slot": "s"},
        }[table]
    )


TABLES = {t.name: t for t in (attempts_table, outbox_table, steps_table)}
#: Where delete_tasks' report counts each table's rows (the journal's steps are not counted).
COUNTED = {"dt_attempts": 0, "dt_outbox": 1}


@pytest.mark.parametrize("table", sorted(BY_TASK))
def test_a_prune_deletes_a_tasks_rows_by_their_index_whatever_the_statistics_say(make_app: Any, table: str) -> None:
    """A single-table DELETE takes no index hint: the prune finds a batch's attempts, outbox
    rows (``dt_outbox`` grows by every submit) and journal steps (by every recorded step) with a
    hinted SELECT and deletes them by primary key. (Its one-statement DELETE was planned as a
    scan of the whole table.)"""
    app: App = make_app()
    ns, now = app.settings.namespace, datetime.now(UTC)
    task_ids = [new_task_id() for _ in range(CLOSED + 1700)]
    with app.engine.begin() as conn:
        conn.execute(sa.insert(TABLES[table]), [task_rows(table, ns, now, task_id) for task_id in task_ids])
    with plans_of_statements_on(app.engine, table) as plans, app.engine.begin() as conn:
        deleted = retention.delete_tasks(conn, task_ids[:CLOSED])
    by_index = [(statement.split()[0], plan["type"], plan["key"]) for statement, plan in plans]
    assert by_index == [("SELECT", "range", BY_TASK[table]), ("DELETE", "range", "PRIMARY")], by_index
    columns = TABLES[table].c
    with app.engine.connect() as conn:
        left = conn.execute(sa.select(columns.task_id).where(columns.namespace == ns)).scalars()
        assert set(left) == set(task_ids[CLOSED:])
    if table in COUNTED:
        assert deleted[COUNTED[table]] == CLOSED
