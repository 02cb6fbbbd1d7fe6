"""Read-only views for operators and tests: one task with its history, backlog per queue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..records import AttemptRecord, OutboxState, TaskRecord, TaskState, attempts_table, outbox_table, tasks_table
from ..state_indexes import state_index
from .payloads import stored_payload

__all__ = ["UNKNOWN_TASK_ERROR", "QueueBacklog", "load_task", "queue_backlogs", "task_rows"]

#: How the dispatcher's ``last_error`` of a row held for an unknown task name begins.
UNKNOWN_TASK_ERROR = "unknown task name"

t = tasks_table.c
o = outbox_table.c
a = attempts_table.c


#: Every column of a task row, its payload read from wherever it is kept.
_TASK_COLUMNS = tuple(stored_payload().label("payload") if c.name == "payload" else c for c in tasks_table.c)


def task_rows(conn: sa.Connection, namespace: str, task_id: str) -> tuple[sa.Row[Any], list[sa.Row[Any]]] | None:
    """The task row and its attempt rows (all generations, oldest first), as stored, its payload
    wherever it is kept (:mod:`.payloads`): the App's :func:`load_task` and the operator's
    :func:`~durable_tasks.readmodel.task_detail` read both."""
    row = conn.execute(sa.select(*_TASK_COLUMNS).where(t.namespace == namespace, t.id == task_id)).one_or_none()
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
    #: Tasks claimed by a worker and not yet ended (RUNNING).
    running: int = 0


#: What each part of :func:`queue_backlogs`' one statement counts.
_OUTBOX, _ENQUEUED, _RUNNING = 0, 1, 2


def queue_backlogs(conn: sa.Connection, namespace: str) -> dict[str, QueueBacklog]:
    """Pending outbox rows (count, oldest), the oldest undelivered task and the running tasks,
    per queue.

    One statement, so one snapshot: every task that is neither final nor waiting is counted
    in exactly one of the three, whatever moves while it runs. (Separate statements could each
    miss a task that moved between them: an outbox row sent, claimed and ended, its follow-up
    written after the outbox was counted.)"""
    held = sa.func.sum(sa.case((o.last_error.like(f"{UNKNOWN_TASK_ERROR}%"), 1), else_=0))
    pending = (
        sa.select(
            sa.literal(_OUTBOX).label("part"),
            o.queue.label("queue"),
            sa.func.count().label("n"),
            sa.func.min(o.created_at).label("oldest"),
            held.label("held"),
        )
        .where(o.namespace == namespace, o.state == OutboxState.PENDING)
        .group_by(o.queue)
    )
    part = sa.case((t.state == TaskState.ENQUEUED, _ENQUEUED), else_=_RUNNING)
    tasks = (
        sa.select(part, t.queue, sa.func.count(), sa.func.min(t.enqueued_at), sa.literal(0))
        .where(t.namespace == namespace, t.state.in_([TaskState.ENQUEUED, TaskState.RUNNING]), state_index())
        .group_by(t.state, t.queue)
    )
    found: dict[str, dict[int, sa.Row[Any]]] = {}
    for row in conn.execute(sa.union_all(pending, tasks)):
        found.setdefault(row.queue, {})[row.part] = row
    out: dict[str, QueueBacklog] = {}
    for queue, parts in found.items():
        outbox, enqueued, running = (parts.get(p) for p in (_OUTBOX, _ENQUEUED, _RUNNING))
        out[queue] = QueueBacklog(
            outbox_backlog=outbox.n if outbox else 0,
            outbox_oldest=outbox.oldest if outbox else None,
            oldest_enqueued=enqueued.oldest if enqueued else None,
            unknown_held=int(outbox.held or 0) if outbox else 0,
            running=running.n if running else 0,
        )
    return out
