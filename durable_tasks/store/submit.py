"""Writing intents inside the caller's transaction: submit and rerun."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ..records import TERMINAL_STATES, OutboxState, TaskState, outbox_table, tasks_table
from . import sql
from .engine import is_postgres

__all__ = [
    "NOTIFY_CHANNEL",
    "NewTask",
    "SubmitOutcome",
    "cancel_task",
    "insert_outbox",
    "rerun_task",
    "submit_task",
]

#: Postgres channel a submit notifies on commit; the payload is the namespace.
NOTIFY_CHANNEL = "durable_tasks"

t = tasks_table.c


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated intent, ready to be written."""

    namespace: str
    name: str
    queue: str
    payload_json: str
    idempotency_key: str | None
    max_attempts: int
    traceparent: str | None
    shadow: bool
    partition_key: str | None = None


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """The task a submit resolved to and whether this call created it."""

    task_id: str
    generation: int
    created: bool


def submit_task(session: Session, task: NewTask, now: datetime) -> SubmitOutcome:
    """Insert the task and its first outbox row in the session's transaction (no commit).

    A duplicate ``(namespace, name, idempotency_key)`` returns the existing task: found in
    the same transaction, committed long ago, or inserted concurrently (ON CONFLICT DO
    NOTHING waits for the other transaction, then yields to it).
    """
    conn = session.connection()
    if task.idempotency_key is not None:
        existing = _find_by_key(conn, task)
        if existing is not None:
            return existing
    task_id = str(uuid.uuid4())
    if (_insert_pg if is_postgres(conn) else _insert)(conn, task, task_id, now):
        return SubmitOutcome(task_id, 0, created=True)
    existing = _find_by_key(conn, task)  # lost to a concurrent duplicate idempotency key
    if existing is None:  # pragma: no cover - the conflicting row must be visible now
        raise RuntimeError("idempotency conflict without a visible task")
    return existing


def _given(task: NewTask, task_id: str) -> dict[str, Any]:
    """The columns of a new task row that come from the submit."""
    return {
        "id": task_id,
        "namespace": task.namespace,
        "name": task.name,
        "queue": task.queue,
        "idempotency_key": task.idempotency_key,
        "payload": task.payload_json,
        "max_attempts": task.max_attempts,
        "traceparent": task.traceparent,
        "partition_key": task.partition_key,
        "shadow": task.shadow,
    }


def _insert(conn: sa.Connection, task: NewTask, task_id: str, now: datetime) -> bool:
    """The task row and its first outbox row; False when the idempotency key was taken."""
    values: dict[str, Any] = {
        **_given(task, task_id),
        "state": TaskState.PENDING,
        "generation": 0,
        "attempt": 0,
        "delivery": 0,
        "reclaims": 0,
        "counted_losses": 0,
        "failures": 0,
        "created_at": now,
    }
    # RETURNING, not rowcount: drivers disagree on rowcount for ON CONFLICT DO NOTHING.
    if conn.execute(_insert_ignoring_duplicate(conn, values).returning(tasks_table.c.id)).first() is None:
        return False
    insert_outbox(conn, task.namespace, task_id, task.queue, 0, 0, task.shadow, now)
    return True


def _insert_pg(conn: sa.Connection, task: NewTask, task_id: str, now: datetime) -> bool:
    """The same in one statement, with the NOTIFY (postgres.sql: submit_task)."""
    params = {**_given(task, task_id), "now": now, "channel": NOTIFY_CHANNEL}
    return conn.exec_driver_sql(sql.postgres()["submit_task"], params).first() is not None


def rerun_task(session: Session, namespace: str, task_id: str, now: datetime) -> int | None:
    """Start a new generation of a task and its first delivery; None if no such task.

    Every execution of an older generation is fenced out from the commit on.
    """
    conn = session.connection()
    row = conn.execute(
        sa.update(tasks_table)
        .where(t.id == task_id, t.namespace == namespace)
        .values(
            generation=t.generation + 1,
            state=TaskState.PENDING,
            attempt=0,
            delivery=0,
            reclaims=0,
            counted_losses=0,
            solo_attempt=None,
            failures=0,
            lease_expires_at=None,
            worker_id=None,
            result=None,
            error_type=None,
            error_message=None,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
        )
        .returning(t.generation, t.queue, t.shadow)
    ).one_or_none()
    if row is None:
        return None
    insert_outbox(conn, namespace, task_id, row.queue, row.generation, 0, row.shadow, now)
    return int(row.generation)


def cancel_task(session: Session, namespace: str, task_id: str, now: datetime) -> bool | None:
    """Cancel a task that has no final write yet; None if no such task, False if already final.

    A running attempt is fenced out: its result fence requires state RUNNING.
    """
    conn = session.connection()
    updated = conn.execute(
        sa.update(tasks_table)
        .where(t.id == task_id, t.namespace == namespace, t.state.not_in(list(TERMINAL_STATES)))
        .values(state=TaskState.CANCELLED, finished_at=now, lease_expires_at=None)
    ).rowcount
    if updated:
        conn.execute(
            sa.update(outbox_table)
            .where(outbox_table.c.task_id == task_id, outbox_table.c.state == OutboxState.PENDING)
            .values(state=OutboxState.DEAD, last_error="task cancelled")
        )
        return True
    exists = conn.execute(sa.select(t.id).where(t.id == task_id, t.namespace == namespace)).first()
    return None if exists is None else False


def _insert_ignoring_duplicate(conn: sa.Connection, values: dict[str, Any]) -> sa.Insert:
    index = ["namespace", "name", "idempotency_key"]
    if is_postgres(conn):
        return postgresql.insert(tasks_table).values(values).on_conflict_do_nothing(index_elements=index)
    return sqlite.insert(tasks_table).values(values).on_conflict_do_nothing(index_elements=index)


def _find_by_key(conn: sa.Connection, task: NewTask) -> SubmitOutcome | None:
    row = conn.execute(
        sa.select(t.id, t.generation).where(
            t.namespace == task.namespace, t.name == task.name, t.idempotency_key == task.idempotency_key
        )
    ).one_or_none()
    return None if row is None else SubmitOutcome(row.id, row.generation, created=False)


def insert_outbox(
    conn: sa.Connection,
    namespace: str,
    task_id: str,
    queue: str,
    generation: int,
    delivery: int,
    shadow: bool,
    now: datetime,
    *,
    due: datetime | None = None,
) -> None:
    """Write one delivery intent, due at ``due`` (default now).

    On Postgres it also wakes dispatchers (NOTIFY is delivered when the transaction commits).
    """
    conn.execute(
        sa.insert(outbox_table).values(
            namespace=namespace,
            task_id=task_id,
            queue=queue,
            generation=generation,
            delivery=delivery,
            state=OutboxState.PENDING,
            attempts=0,
            next_attempt_at=due or now,
            shadow=shadow,
            created_at=now,
        )
    )
    if is_postgres(conn):
        conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, namespace)))
