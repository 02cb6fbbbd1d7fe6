"""Writing intents inside the caller's transaction: the statements of submit, rerun, cancel.

SQLAlchemy Core on the caller's connection; the store that calls them adds what its dialect
needs (how a duplicate idempotency key is ignored, how dispatchers are woken).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..codec import utf8_length
from ..records import TERMINAL_STATES, OutboxState, TaskState, outbox_table, tasks_table

__all__ = [
    "NewTask",
    "RerunRow",
    "SubmitOutcome",
    "cancel_task",
    "find_by_key",
    "find_by_keys",
    "insert_first_outboxes",
    "insert_outbox",
    "outbox_row",
    "rerun_task",
    "rerun_values",
    "task_row",
]

t = tasks_table.c
#: Built once and run with each row's values: a statement built per row costs SQLAlchemy a
#: coercion and a cache-key entry per column, in the submitting thread.
_INSERT_OUTBOX = sa.insert(outbox_table)


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
    #: Flow control: the priority level (None: 0) and the concurrency key (durable_tasks.flow).
    priority: int | None = None
    concurrency_key: str | None = None
    #: When the first delivery is due (None: at once).
    due: datetime | None = None
    #: A child task's parent (``durable_tasks.journal``): the task, generation and slot it settles.
    parent_id: str | None = None
    parent_generation: int | None = None
    parent_slot: str | None = None

    @property
    def payload_bytes(self) -> int:
        """The payload's size in UTF-8 bytes (as ``dt_tasks.payload_bytes`` keeps it)."""
        return utf8_length(self.payload_json)


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """The task a submit resolved to and whether this call created it."""

    task_id: str
    generation: int
    created: bool


def task_row(task: NewTask, task_id: str, now: datetime, *, aside: bool = False) -> dict[str, Any]:
    """Every column of a new task row; its payload ``''`` when it is kept ``aside``, in
    ``dt_payloads`` (:mod:`.payloads`)."""
    return {
        "id": task_id,
        "namespace": task.namespace,
        "name": task.name,
        "queue": task.queue,
        "idempotency_key": task.idempotency_key,
        "payload": "" if aside else task.payload_json,
        "payload_bytes": task.payload_bytes,
        "max_attempts": task.max_attempts,
        "traceparent": task.traceparent,
        "partition_key": task.partition_key,
        "priority": task.priority,
        "concurrency_key": task.concurrency_key,
        "shadow": task.shadow,
        "parent_id": task.parent_id,
        "parent_generation": task.parent_generation,
        "parent_slot": task.parent_slot,
        "state": TaskState.PENDING,
        "generation": 0,
        "attempt": 0,
        "delivery": 0,
        "reclaims": 0,
        "counted_losses": 0,
        "failures": 0,
        "created_at": now,
    }


def find_by_key(conn: sa.Connection, task: NewTask) -> SubmitOutcome | None:
    """The task already holding ``task``'s idempotency key, if any."""
    row = conn.execute(
        sa.select(t.id, t.generation).where(
            t.namespace == task.namespace, t.name == task.name, t.idempotency_key == task.idempotency_key
        )
    ).one_or_none()
    return None if row is None else SubmitOutcome(row.id, row.generation, created=False)


#: Keys looked up per statement at most (well inside every database's limit on parameters).
_KEYS_PER_LOOKUP = 500


def find_by_keys(conn: sa.Connection, tasks: Sequence[NewTask]) -> dict[tuple[str, str], SubmitOutcome]:
    """The tasks holding the idempotency keys of ``tasks`` (of one namespace), by (name, key):
    one statement per task name and 500 keys, each an index range of the key's unique index."""
    by_name: dict[str, list[str]] = {}
    for task in tasks:
        if task.idempotency_key is not None:
            by_name.setdefault(task.name, []).append(task.idempotency_key)
    found: dict[tuple[str, str], SubmitOutcome] = {}
    for name, keys in by_name.items():
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _KEYS_PER_LOOKUP):
            rows = conn.execute(
                sa.select(t.id, t.generation, t.idempotency_key).where(
                    t.namespace == tasks[0].namespace,
                    t.name == name,
                    t.idempotency_key.in_(unique[start : start + _KEYS_PER_LOOKUP]),
                )
            )
            found.update({(name, r.idempotency_key): SubmitOutcome(r.id, r.generation, created=False) for r in rows})
    return found


@dataclass(frozen=True, slots=True)
class RerunRow:
    """What a rerun needs of the task it restarted."""

    generation: int
    queue: str
    shadow: bool


#: A new generation starts from scratch: everything an execution wrote is cleared.
rerun_values: dict[str, Any] = {
    "generation": t.generation + 1,
    "state": TaskState.PENDING,
    "attempt": 0,
    "delivery": 0,
    "reclaims": 0,
    "counted_losses": 0,
    "solo_attempt": None,
    "failures": 0,
    "lease_expires_at": None,
    "worker_id": None,
    "result": None,
    "error_type": None,
    "error_message": None,
    "enqueued_at": None,
    "started_at": None,
    "finished_at": None,
}


def rerun_task(
    conn: sa.Connection, namespace: str, task_id: str, now: datetime, *, due: datetime | None = None
) -> RerunRow | None:
    """Start a new generation of a task and its first delivery, due at ``due`` (default now);
    None if no such task. Every execution of an older generation is fenced out from the commit
    on. (An UPDATE, then a read of the row it locked: every dialect, RETURNING or not.)"""
    mine = sa.and_(t.id == task_id, t.namespace == namespace)
    if not conn.execute(sa.update(tasks_table).where(mine).values(rerun_values)).rowcount:
        return None
    row = conn.execute(sa.select(t.generation, t.queue, t.shadow).where(mine)).one()
    insert_outbox(conn, namespace, task_id, row.queue, row.generation, 0, row.shadow, now, due=due)
    return RerunRow(int(row.generation), row.queue, bool(row.shadow))


def cancel_task(conn: sa.Connection, namespace: str, task_id: str, now: datetime) -> bool | None:
    """Cancel a task that has no final write yet; None if no such task, False if already final.

    A running attempt is fenced out: its result fence requires state RUNNING.
    """
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
    """Write one delivery intent, due at ``due`` (default now). The store wakes dispatchers."""
    row = outbox_row(namespace, task_id, queue, generation, delivery, shadow, now, due=due)
    conn.execute(_INSERT_OUTBOX, row)


def insert_first_outboxes(conn: sa.Connection, created: Sequence[tuple[NewTask, str]], now: datetime) -> None:
    """The first delivery intent of each new task, ``(task, its id)``, in one executemany."""
    if created:
        rows = [
            outbox_row(task.namespace, task_id, task.queue, 0, 0, task.shadow, now, due=task.due)
            for task, task_id in created
        ]
        conn.execute(_INSERT_OUTBOX, rows)


def outbox_row(
    namespace: str,
    task_id: str,
    queue: str,
    generation: int,
    delivery: int,
    shadow: bool,
    now: datetime,
    *,
    due: datetime | None = None,
) -> dict[str, Any]:
    """The columns of a new delivery intent, due at ``due`` (default now)."""
    return {
        "namespace": namespace,
        "task_id": task_id,
        "queue": queue,
        "generation": generation,
        "delivery": delivery,
        "state": OutboxState.PENDING,
        "attempts": 0,
        "next_attempt_at": due or now,
        "shadow": shadow,
        "created_at": now,
    }
