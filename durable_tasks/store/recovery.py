"""The reaper's SQL: lease views, redelivery as a new outbox row, dead-lettering, and the
reconciler's search for deliveries Redis may have lost.

Redelivery always goes through the database (delivery + 1, a new outbox row), never by
handing the old entry to another consumer: the old entry can then be acknowledged safely,
and a zombie's late XACK of it removes nothing that anybody else holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..policy import TaskLeaseView, loss_counts
from ..records import (
    TERMINAL_STATES,
    AttemptOutcome,
    OutboxState,
    TaskState,
    attempts_table,
    outbox_table,
    tasks_table,
)
from ..state_indexes import sent_tasks
from .execution import close_open_attempts
from .payloads import stored_payload
from .planning import attempts_by_task, tasks_by_id
from .submit import outbox_row

__all__ = [
    "DeadTask",
    "ReconcileCursor",
    "UnconfirmedDelivery",
    "UnconfirmedPage",
    "dead_letter_task",
    "lease_views",
    "redeliver",
    "redeliver_many",
    "unconfirmed_deliveries",
]

t = tasks_table.c
o = outbox_table.c
a = attempts_table.c
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
        ).where(tasks_by_id(namespace, ids))
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


#: Tasks that owe no entry on their delivery: finished, or suspended (the resume makes a
#: delivery of its own). The reaper acts on what it read a moment before, and a worker past its
#: lease (a late heartbeat) may have suspended the task since: it is left waiting.
_OWE_NO_ENTRY = [*TERMINAL_STATES, TaskState.WAITING]


def _unowned(task_id: str, namespace: str, generation: int, delivery: int, now: datetime) -> sa.ColumnElement[bool]:
    """The task still waits on this delivery and nobody holds a live lease on it."""
    return sa.and_(
        t.id == task_id,
        t.namespace == namespace,
        t.generation == generation,
        t.delivery == delivery,
        t.state.not_in(_OWE_NO_ENTRY),
        sa.or_(t.state != TaskState.RUNNING, t.lease_expires_at.is_(None), t.lease_expires_at <= now),
    )


#: 1 when losing the current delivery counts toward max_deliveries: policy.loss_counts in SQL.
_LOSS_COUNTS = sa.case((sa.and_(t.state == TaskState.RUNNING, t.solo_attempt == t.attempt), 1), else_=0)
#: 1 when losing it makes the task more suspect: policy.loss_suspects in SQL.
_LOSS_SUSPECTS = sa.case((sa.and_(t.state == TaskState.RUNNING, t.started_at.is_not(None)), 1), else_=0)


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
    now); False if stale. :func:`redeliver_many` of one."""
    key = (task_id, generation, delivery)
    return redeliver_many(conn, namespace, [key], now=now, reason=reason, count_reclaim=count_reclaim, due=due)[0]


def redeliver_many(
    conn: sa.Connection,
    namespace: str,
    lost: Sequence[tuple[str, int, int]],
    *,
    now: datetime,
    reason: str,
    count_reclaim: bool,
    due: datetime | None = None,
) -> list[bool]:
    """Supersede each delivery ``(task_id, generation, delivery)`` nobody holds with a new one
    (outbox row, delivery + 1, due at ``due``, default now); one flag per item, False if stale.
    Each is judged on its task as it was before the call (a delivery made here names no entry
    yet), and a key repeated is stale after its first.

    ``count_reclaim`` is True when a worker lost them (counts toward ``max_deliveries``) and
    False when Redis lost them (the reconciler): a broker's data loss is not the task's fault.
    A fixed number of statements per chunk of rows, whatever its size: a reaper's page of a dead
    worker's entries costs a few round trips, not four per task. The new delivery intents are written here
    (the store wakes dispatchers).
    """
    ids = sorted({task_id for task_id, _, _ in lost})
    moved: set[tuple[str, int, int]] = set()
    for lo in range(0, len(ids), _CHUNK):
        taken = _take_unowned(conn, namespace, ids[lo : lo + _CHUNK], set(lost), now)
        if taken:
            _supersede(conn, namespace, taken, now=now, reason=reason, count_reclaim=count_reclaim, due=due)
            moved.update((row.id, row.generation, row.delivery) for row in taken)
    return first_of(lost, moved)


def first_of(lost: Sequence[tuple[str, int, int]], moved: set[tuple[str, int, int]]) -> list[bool]:
    """One flag per item of ``lost``: whether it names a delivery that was ``moved`` on, for
    the first item naming it only (a key repeated is stale after its first)."""
    seen: set[tuple[str, int, int]] = set()
    flags = []
    for key in lost:
        flags.append(key in moved and key not in seen)
        seen.add(key)
    return flags


#: Tasks per statement of :func:`redeliver_many` (bound parameters stay far below every
#: dialect's limit).
_CHUNK = 500


class _Taken(NamedTuple):
    id: str
    generation: int
    delivery: int
    queue: str
    shadow: bool


def _take_unowned(
    conn: sa.Connection,
    namespace: str,
    ids: Sequence[str],
    keys: set[tuple[str, int, int]],
    now: datetime,
) -> list[_Taken]:
    """Lock the rows of ``ids`` in id order (as every multi-row write of dt_tasks does) and
    keep those nobody holds, still waiting on the delivery a key ``(task_id, generation,
    delivery)`` names."""
    rows = conn.execute(
        sa.select(t.id, t.namespace, t.state, t.generation, t.delivery, t.lease_expires_at, t.queue, t.shadow)
        .where(t.id.in_(ids))
        .order_by(t.id)
        .with_for_update()
    ).all()
    taken: list[_Taken] = []
    for r in rows:
        state = TaskState(r.state)
        if r.namespace != namespace or state in _OWE_NO_ENTRY or (r.id, r.generation, r.delivery) not in keys:
            continue
        if state == TaskState.RUNNING and r.lease_expires_at is not None and r.lease_expires_at > now:
            continue
        taken.append(_Taken(r.id, r.generation, r.delivery, r.queue, r.shadow))
    return taken


def _supersede(
    conn: sa.Connection,
    namespace: str,
    taken: Sequence[_Taken],
    *,
    now: datetime,
    reason: str,
    count_reclaim: bool,
    due: datetime | None,
) -> None:
    """The rows :func:`_take_unowned` locked and chose: the next delivery, their open attempts
    lost, a new outbox row each."""
    ids = [row.id for row in taken]
    conn.execute(
        sa.update(tasks_table)
        .where(t.id.in_(ids))
        # counted_losses and reclaims first: MySQL evaluates SET left to right, each on the values
        # already set (their CASEs must read the state before it becomes PENDING); the others read
        # the old row.
        .ordered_values(
            (t.counted_losses, t.counted_losses + (_LOSS_COUNTS if count_reclaim else sa.literal(0))),
            (t.reclaims, t.reclaims + (_LOSS_SUSPECTS if count_reclaim else sa.literal(0))),
            (t.state, TaskState.PENDING),
            (t.delivery, t.delivery + 1),
            (t.lease_expires_at, None),
        )
    )
    # Attempts still open (their worker vanished) end as lost, in the current generation only.
    conn.execute(
        attempts_by_task(sa.update(attempts_table))
        .where(
            a.task_id.in_(ids),  # by ix_dt_attempts_task
            sa.tuple_(a.task_id, a.generation).in_([(row.id, row.generation) for row in taken]),
            a.outcome.is_(None),
        )
        .values(outcome=AttemptOutcome.LOST, finished_at=now, retry_reason=reason)
    )
    conn.execute(
        sa.insert(outbox_table),
        [
            outbox_row(namespace, row.id, row.queue, row.generation, row.delivery + 1, row.shadow, now, due=due)
            for row in taken
        ],
    )


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
        sa.select(t.id, t.name, t.queue, stored_payload(), t.idempotency_key, t.shadow, t.attempt, t.generation).where(
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
    priority: int | None = None


#: Where the reconciler's walk stands: the (enqueued_at, id) of the last task it read (an
#: enqueued_at of None: still among the tasks claimed before their mark-SENT, which have none).
ReconcileCursor = tuple[datetime | None, str]


@dataclass(frozen=True, slots=True)
class UnconfirmedPage:
    """One page of the reconciler's walk, and where the next page starts (None: this page
    was the last, the next walk starts over)."""

    deliveries: list[UnconfirmedDelivery]
    cursor: ReconcileCursor | None


def unconfirmed_deliveries(
    conn: sa.Connection,
    namespace: str,
    *,
    now: datetime,
    grace: timedelta,
    limit: int,
    after: ReconcileCursor | None = None,
) -> UnconfirmedPage:
    """Tasks ENQUEUED for longer than ``grace``, or RUNNING with an expired lease, with the
    entry id their current delivery was published as: ``limit`` of them in (enqueued_at, id)
    order after ``after`` (keyset pagination on ix_dt_tasks_sent), so that a walk reaches the
    lost entries behind a backlog that Redis still holds. Tasks without an enqueued_at (a
    worker claimed them before their mark-SENT) come first, in id order."""
    sent = (
        sa.select(
            t.id, t.queue, t.shadow, t.generation, t.delivery, t.enqueued_at, o.stream_id, o.partition, t.priority
        )
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
            sent_tasks(),  # ix_dt_tasks_sent's predicate, in constants (a generic plan's too)
            sa.or_(
                sa.and_(t.state == TaskState.ENQUEUED, t.enqueued_at <= now - grace),
                sa.and_(t.state == TaskState.RUNNING, t.lease_expires_at <= now),
            ),
        )
    )
    rows: list[Any] = []  # the Row type of a 9-column select
    if after is None or after[0] is None:
        unstamped = sent.where(t.enqueued_at.is_(None))
        if after is not None:
            unstamped = unstamped.where(t.id > after[1])
        rows += conn.execute(unstamped.order_by(t.id).limit(limit)).all()
        stamped = sent.where(t.enqueued_at.is_not(None))
    else:
        last = sa.tuple_(sa.literal(after[0], t.enqueued_at.type), sa.literal(after[1], t.id.type))
        stamped = sent.where(sa.tuple_(t.enqueued_at, t.id) > last)
    if len(rows) < limit:
        rows += conn.execute(stamped.order_by(t.enqueued_at, t.id).limit(limit - len(rows))).all()
    deliveries = [
        UnconfirmedDelivery(r.id, r.queue, r.shadow, r.generation, r.delivery, r.stream_id, r.partition, r.priority)
        for r in rows
        if r.stream_id
    ]
    return UnconfirmedPage(deliveries, (rows[-1].enqueued_at, rows[-1].id) if len(rows) == limit else None)
