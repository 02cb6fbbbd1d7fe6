"""The reaper's SQL: lease views, redelivery as a new outbox row, dead-lettering, and the
reconciler's search for deliveries Redis may have lost.

Redelivery always goes through the database (delivery + 1, a new outbox row), never by
handing the old entry to another consumer: the old entry can then be acknowledged safely,
and a zombie's late XACK of it removes nothing that anybody else holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

import sqlalchemy as sa

from ..policy import TaskLeaseView, loss_counts
from ..records import TERMINAL_STATES, OutboxState, TaskState, outbox_table, tasks_table
from .execution import close_open_attempts
from .submit import insert_outbox

__all__ = ["DeadTask", "UnconfirmedDelivery", "dead_letter_task", "lease_views", "redeliver", "unconfirmed_deliveries"]

t = tasks_table.c
o = outbox_table.c
logger = logging.getLogger(__name__)


def lease_views(conn: sa.Connection, namespace: str, task_ids: Iterable[str]) -> dict[str, TaskLeaseView]:
    """What the database says about each task (absent ids: no such task)."""
    ids = list(set(task_ids))
    if not ids:
        return {}
    rows = conn.execute(
        sa.select(
            t.id,
            t.state,
            t.generation,
            t.delivery,
            t.lease_expires_at,
            t.reclaims,
            t.counted_losses,
            t.attempt,
            t.solo_attempt,
        ).where(t.namespace == namespace, t.id.in_(ids))
    ).all()
    return {
        r.id: TaskLeaseView(
            TaskState(r.state),
            r.generation,
            r.delivery,
            r.lease_expires_at,
            r.reclaims,
            counted_losses=r.counted_losses,
            loss_counts=loss_counts(TaskState(r.state), r.attempt, r.solo_attempt),
        )
        for r in rows
    }


def _unowned(task_id: str, namespace: str, generation: int, delivery: int, now: datetime) -> sa.ColumnElement[bool]:
    """The task still waits on this delivery and nobody holds a live lease on it."""
    return sa.and_(
        t.id == task_id,
        t.namespace == namespace,
        t.generation == generation,
        t.delivery == delivery,
        t.state.not_in(list(TERMINAL_STATES)),
        sa.or_(t.state != TaskState.RUNNING, t.lease_expires_at.is_(None), t.lease_expires_at <= now),
    )


#: 1 when losing the current delivery counts toward max_deliveries: policy.loss_counts in SQL.
_LOSS_COUNTS = sa.case((sa.and_(t.state == TaskState.RUNNING, t.solo_attempt == t.attempt), 1), else_=0)


def redeliver(
    conn: sa.Connection,
    namespace: str,
    *,
    task_id: str,
    generation: int,
    delivery: int,
    now: datetime,
    reason: str,
    count_reclaim: bool,
    due: datetime | None = None,
) -> bool:
    """Supersede a delivery with a new one (outbox row, delivery + 1, due at ``due``, default
    now); False if stale.

    ``count_reclaim`` is True when a worker lost it (counts toward ``max_deliveries``) and
    False when Redis lost it (the reconciler): a broker's data loss is not the task's fault.
    The new delivery intent is written here (the store wakes dispatchers).
    """
    updated = conn.execute(
        sa.update(tasks_table)
        .where(_unowned(task_id, namespace, generation, delivery, now))
        # counted_losses first: MySQL evaluates SET left to right, each on the values already
        # set (its CASE must read the state before it becomes PENDING); the others read the old row.
        .ordered_values(
            (t.counted_losses, t.counted_losses + (_LOSS_COUNTS if count_reclaim else sa.literal(0))),
            (t.state, TaskState.PENDING),
            (t.delivery, t.delivery + 1),
            (t.reclaims, t.reclaims + (1 if count_reclaim else 0)),
            (t.lease_expires_at, None),
        )
    ).rowcount
    if not updated:
        return False
    # The row this transaction just locked (an UPDATE, then a read: every dialect).
    row = conn.execute(sa.select(t.queue, t.shadow).where(t.id == task_id)).one()
    close_open_attempts(conn, task_id, generation, now, reason=reason)
    insert_outbox(conn, namespace, task_id, row.queue, generation, delivery + 1, row.shadow, now, due=due)
    return True


class DeadTask(NamedTuple):
    """What a dead-lettered task's ``on_failure`` hooks are told about it."""

    id: str
    name: str
    queue: str
    payload: str
    idempotency_key: str | None
    shadow: bool
    attempt: int
    generation: int


def dead_letter_task(
    conn: sa.Connection,
    namespace: str,
    *,
    task_id: str,
    generation: int,
    delivery: int,
    now: datetime,
    reason: str,
    on_dead: Callable[[sa.Connection, DeadTask], None] | None = None,
) -> bool:
    """Mark the task DEAD (kept for inspection and replay); False if it moved on meanwhile.

    ``on_dead(conn, row)`` (the task's failure hooks) runs in the same transaction with the
    task row; if it raises, its writes roll back and the task is DEAD all the same.
    """
    updated = conn.execute(
        sa.update(tasks_table)
        .where(_unowned(task_id, namespace, generation, delivery, now))
        .values(
            state=TaskState.DEAD,
            error_type="DeadLettered",
            error_message=reason,
            finished_at=now,
            lease_expires_at=None,
        )
    ).rowcount
    if not updated:
        return False
    row = conn.execute(
        sa.select(t.id, t.name, t.queue, t.payload, t.idempotency_key, t.shadow, t.attempt, t.generation).where(
            t.id == task_id
        )
    ).one()
    close_open_attempts(conn, task_id, generation, now, reason=reason)
    if on_dead is not None and not row.shadow:
        savepoint = conn.begin_nested()
        try:
            on_dead(conn, DeadTask(*row))
            savepoint.commit()
        except Exception:
            savepoint.rollback()
            logger.exception("failure hooks of dead-lettered task %s raised; it is DEAD regardless", task_id)
    return True


@dataclass(frozen=True, slots=True)
class UnconfirmedDelivery:
    """A task waiting on a delivery that was sent: is its entry still in Redis?"""

    task_id: str
    queue: str
    shadow: bool
    generation: int
    delivery: int
    stream_id: str
    partition: int | None = None


def unconfirmed_deliveries(
    conn: sa.Connection, namespace: str, *, now: datetime, grace: timedelta, limit: int
) -> list[UnconfirmedDelivery]:
    """Tasks ENQUEUED for longer than ``grace``, or RUNNING with an expired lease, with the
    entry id their current delivery was published as."""
    query = (
        sa.select(t.id, t.queue, t.shadow, t.generation, t.delivery, o.stream_id, o.partition)
        .join(
            outbox_table,
            sa.and_(
                o.task_id == t.id,
                o.generation == t.generation,
                o.delivery == t.delivery,
                o.state == OutboxState.SENT,
            ),
        )
        .where(
            t.namespace == namespace,
            sa.or_(
                sa.and_(t.state == TaskState.ENQUEUED, t.enqueued_at <= now - grace),
                sa.and_(t.state == TaskState.RUNNING, t.lease_expires_at <= now),
            ),
        )
        .order_by(t.enqueued_at)
        .limit(limit)
    )
    rows = conn.execute(query).all()
    return [
        UnconfirmedDelivery(r.id, r.queue, r.shadow, r.generation, r.delivery, r.stream_id, r.partition)
        for r in rows
        if r.stream_id
    ]
