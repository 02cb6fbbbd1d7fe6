"""Read-only views for operators and tests: one task with its history, backlog per queue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..records import AttemptRecord, OutboxState, TaskRecord, TaskState, attempts_table, outbox_table, tasks_table

__all__ = ["UNKNOWN_TASK_ERROR", "QueueBacklog", "load_task", "queue_backlogs", "task_rows"]

#: How the dispatcher's ``last_error`` of a row held for an unknown task name begins.
UNKNOWN_TASK_ERROR = "unknown task name"

t = tasks_table.c
o = outbox_table.c
a = attempts_table.c


def task_rows(conn: sa.Connection, namespace: str, task_id: str) -> tuple[sa.Row[Any], list[sa.Row[Any]]] | None:
    """The task row and its attempt rows (all generations, oldest first), as stored: the App's
    :func:`load_task` and the operator's :func:`~durable_tasks.readmodel.task_detail` read both."""
    row = conn.execute(sa.select(tasks_table).where(t.namespace == namespace, t.id == task_id)).one_or_none()
    if row is None:
        return None
    attempts = conn.execute(
        sa.select(attempts_table)
        .where(a.namespace == namespace, a.task_id == task_id)
        .order_by(a.generation, a.attempt, a.id)
    ).all()
    return row, list(attempts)


def load_task(conn: sa.Connection, namespace: str, task_id: str) -> tuple[TaskRecord, list[AttemptRecord]] | None:
    """The task record and its attempt records (all generations, oldest first)."""
    rows = task_rows(conn, namespace, task_id)
    if rows is None:
        return None
    row, attempts = rows
    return TaskRecord.model_validate(row._mapping), [AttemptRecord.model_validate(r._mapping) for r in attempts]


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    """What the database says about one queue."""

    outbox_backlog: int
    outbox_oldest: datetime | None
    oldest_enqueued: datetime | None
    #: Pending rows a dispatcher held because it does not register their task's name.
    unknown_held: int = 0


def queue_backlogs(conn: sa.Connection, namespace: str) -> dict[str, QueueBacklog]:
    """Pending outbox rows (count, oldest) and the oldest undelivered task, per queue."""
    held = sa.func.sum(sa.case((o.last_error.like(f"{UNKNOWN_TASK_ERROR}%"), 1), else_=0))
    outbox = {
        r.queue: (r.n, r.oldest, int(r.held or 0))
        for r in conn.execute(
            sa.select(
                o.queue, sa.func.count().label("n"), sa.func.min(o.created_at).label("oldest"), held.label("held")
            )
            .where(o.namespace == namespace, o.state == OutboxState.PENDING)
            .group_by(o.queue)
        )
    }
    enqueued = {
        r.queue: r.oldest
        for r in conn.execute(
            sa.select(t.queue, sa.func.min(t.enqueued_at).label("oldest"))
            .where(t.namespace == namespace, t.state == TaskState.ENQUEUED)
            .group_by(t.queue)
        )
    }
    queues = set(outbox) | set(enqueued)
    none: tuple[int, datetime | None, int] = (0, None, 0)
    return {q: QueueBacklog(*outbox.get(q, none)[:2], enqueued.get(q), outbox.get(q, none)[2]) for q in queues}
