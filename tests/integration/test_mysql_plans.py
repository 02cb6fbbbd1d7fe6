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


def test_a_prune_deletes_attempts_by_their_index_whatever_the_statistics_say(make_app: Any) -> None:
    """A single-table DELETE takes no index hint: the prune finds the attempts with a hinted
    SELECT and deletes them by primary key. (Its one-statement DELETE was planned as a scan.)"""
    app: App = make_app()
    task_ids = open_attempts(app, datetime.now(UTC))
    with plans_of_statements_on(app.engine, "dt_attempts") as plans, app.engine.begin() as conn:
        attempts, _, _ = retention.delete_tasks(conn, task_ids[:CLOSED])
    assert [statement.split()[0] for statement, _ in plans] == ["SELECT", "DELETE"]
    by_index = [(plan["type"], plan["key"]) for _, plan in plans]
    assert by_index == [("range", "ix_dt_attempts_task"), ("range", "PRIMARY")], [dict(plan) for _, plan in plans]
    with app.engine.connect() as conn:
        ns = app.settings.namespace
        left = conn.execute(sa.select(attempts_table.c.task_id).where(attempts_table.c.namespace == ns)).scalars()
        assert set(left) == set(task_ids[CLOSED:])
    assert attempts == CLOSED


def test_a_prune_deletes_outbox_rows_by_their_index_whatever_the_statistics_say(make_app: Any) -> None:
    """The same for the outbox rows of a batch's tasks (``dt_outbox`` grows by every submit)."""
    app: App = make_app()
    ns, now = app.settings.namespace, datetime.now(UTC)
    task_ids = [new_task_id() for _ in range(CLOSED + 1700)]
    row = {"namespace": ns, "queue": "q", "generation": 0, "delivery": 0, "state": "SENT", "attempts": 1}
    with app.engine.begin() as conn:
        rows = [
            row | {"task_id": task_id, "next_attempt_at": now, "shadow": False, "created_at": now}
            for task_id in task_ids
        ]
        conn.execute(sa.insert(outbox_table), rows)
    with plans_of_statements_on(app.engine, "dt_outbox") as plans, app.engine.begin() as conn:
        _, outbox_rows, _ = retention.delete_tasks(conn, task_ids[:CLOSED])
    by_index = [(statement.split()[0], plan["type"], plan["key"]) for statement, plan in plans]
    assert by_index == [("SELECT", "range", "ix_dt_outbox_task_id"), ("DELETE", "range", "PRIMARY")], by_index
    with app.engine.connect() as conn:
        left = conn.execute(sa.select(outbox_table.c.task_id).where(outbox_table.c.namespace == ns)).scalars()
        assert set(left) == set(task_ids[CLOSED:])
    assert outbox_rows == CLOSED


def test_a_prune_deletes_journal_steps_by_their_index_whatever_the_statistics_say(make_app: Any) -> None:
    """The same for a batch's journal steps (``dt_steps`` grows by every recorded step)."""
    app: App = make_app()
    ns, now = app.settings.namespace, datetime.now(UTC)
    task_ids = [new_task_id() for _ in range(CLOSED + 1700)]
    row = {"namespace": ns, "generation": 0, "kind": "step", "label": "l", "done": True, "created_at": now}
    with app.engine.begin() as conn:
        conn.execute(sa.insert(steps_table), [row | {"task_id": task_id, "slot": "s"} for task_id in task_ids])
    with plans_of_statements_on(app.engine, "dt_steps") as plans, app.engine.begin() as conn:
        retention.delete_tasks(conn, task_ids[:CLOSED])
    by_index = [(statement.split()[0], plan["type"], plan["key"]) for statement, plan in plans]
    assert by_index == [("SELECT", "range", "uq_dt_steps_slot"), ("DELETE", "range", "PRIMARY")], by_index
    with app.engine.connect() as conn:
        left = conn.execute(sa.select(steps_table.c.task_id).where(steps_table.c.namespace == ns)).scalars()
        assert set(left) == set(task_ids[CLOSED:])
