"""The dispatcher's SQL: claim due outbox rows under a lease, then record each outcome.

No row lock is held across a Redis call: the claim commits a lease (and a claim token), the
dispatcher publishes, and every outcome update is fenced by that token, so a dispatcher
whose lease ran out cannot overwrite the work of the one that took over.

SQLAlchemy Core on a connection whose transaction the store opened; PostgreSQL runs its own
named statements for the usual pass (:mod:`.postgres`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..immutable import immutable
from ..records import TERMINAL_STATES, OutboxState, TaskState, outbox_table, tasks_table
from .payloads import INLINE_PAYLOAD_BYTES, inline_payload
from .queries import UNKNOWN_TASK_ERROR

__all__ = [
    "INLINE_PAYLOAD_BYTES",
    "ClaimedDelivery",
    "Dead",
    "NewDelivery",
    "Retry",
    "Sent",
    "claim_rows",
    "claimed_rows",
    "dead_error_type",
    "deliveries",
    "mark_dead",
    "mark_sent",
    "mark_sent_at_once",
    "next_due",
    "release",
    "schedule_retry",
]

o = outbox_table.c
t = tasks_table.c


@immutable
class ClaimedDelivery:
    """An outbox row this dispatcher holds the lease on, with what publishing needs."""

    outbox_id: int
    claim_token: str
    task_id: str
    name: str
    queue: str
    generation: int
    delivery: int
    attempts: int
    shadow: bool
    #: The task's payload, or None when it is over :data:`INLINE_PAYLOAD_BYTES`: a pass holds
    #: at most a batch of small ones, and reads a large one when it needs it (see the dispatcher).
    payload_json: str | None
    traceparent: str | None
    created_at: datetime
    partition_key: str | None = None
    #: Flow control (durable_tasks.flow): the task's priority level and concurrency key.
    priority: int = 0
    concurrency_key: str | None = None
    #: The task was written without ``payload_bytes``: by a producer's SQL (``dt_submit``) or by
    #: code before schema 15, so its JSON is not known to be ``App.submit``'s encoder's and the
    #: dispatcher checks it for keys that appear twice (:func:`..codec.duplicate_key`).
    foreign_json: bool = False


@immutable
class NewDelivery:
    """A delivery the runtime itself just wrote (a parent's resume): what publishing it needs."""

    task_id: str
    name: str
    queue: str
    generation: int
    delivery: int
    shadow: bool
    traceparent: str | None
    partition_key: str | None
    priority: int | None
    concurrency_key: str | None


#: A published row, its stream entry id and partition.
Sent = tuple[ClaimedDelivery, str, int | None]
#: A row that cannot be delivered, and why.
Dead = tuple[ClaimedDelivery, str]
#: A row whose publish failed: when to try again, and the error.
Retry = tuple[ClaimedDelivery, datetime, str]


def deliveries(claimed: Sequence[Any], token: str) -> list[ClaimedDelivery]:
    """Claimed rows (in :func:`claim_rows`' column order) as deliveries, by outbox id."""
    # Unpacked by position (the SELECT/RETURNING order): a Row's attribute access per column
    # is most of this function's CPU on a full batch.
    return [
        ClaimedDelivery(
            outbox_id=outbox_id,
            claim_token=token,
            task_id=task_id,
            name=name,
            queue=queue,
            generation=generation,
            delivery=delivery,
            attempts=attempts,
            shadow=shadow,
            payload_json=payload,
            traceparent=traceparent,
            created_at=created_at,
            partition_key=partition_key,
            priority=priority or 0,
            concurrency_key=concurrency_key,
            foreign_json=foreign_json,
        )
        for (
            outbox_id,
            task_id,
            queue,
            generation,
            delivery,
            attempts,
            shadow,
            created_at,
            name,
            payload,
            traceparent,
            partition_key,
            priority,
            concurrency_key,
            foreign_json,
        ) in sorted(claimed)  # by outbox id, the first column (unique)
    ]


def next_due(conn: sa.Connection, namespace: str, *, now: datetime) -> datetime | None:
    """When the earliest PENDING row that is not due at ``now`` will be (None: none waits):
    the first entry of ix_dt_outbox_pending_due past now."""
    found: datetime | None = conn.execute(
        sa.select(o.next_attempt_at)
        .where(o.namespace == namespace, o.state == OutboxState.PENDING, o.next_attempt_at > now)
        .order_by(o.next_attempt_at)
        .limit(1)
    ).scalar_one_or_none()
    if found is not None and found.tzinfo is None:  # SQLite hands back naive UTC
        found = found.replace(tzinfo=UTC)
    return found


def claim_rows(
    conn: sa.Connection,
    namespace: str,
    token: str,
    *,
    now: datetime,
    lease: timedelta,
    limit: int,
    watermark: int | None,
) -> Sequence[Any]:
    """Lease up to ``limit`` due PENDING rows (oldest first) and read what publishing needs
    (UPDATE … RETURNING cannot name a joined table everywhere: lease the rows, then read them).
    Rows in :func:`deliveries`' column order."""
    due = sa.select(o.id).where(
        o.namespace == namespace,
        o.state == OutboxState.PENDING,
        o.next_attempt_at <= now,
        sa.or_(o.lease_expires_at.is_(None), o.lease_expires_at <= now),
    )
    if watermark is not None:
        due = due.where(o.id >= watermark)
    leased = (
        conn.execute(
            sa.update(outbox_table)
            .values(lease_expires_at=now + lease, claim_token=token)
            .where(o.id.in_(due.order_by(o.next_attempt_at, o.id).limit(limit).scalar_subquery()))
            .returning(o.id)
        )
        .scalars()
        .all()
    )
    if not leased:
        return []
    return conn.execute(claimed_rows(leased)).all()


def claimed_rows(ids: Sequence[int]) -> sa.Select[Any]:
    """The leased rows ``ids`` with what publishing needs, in :func:`deliveries`' column order
    (a payload over :data:`INLINE_PAYLOAD_BYTES` as NULL: :mod:`.payloads`)."""
    return (
        sa.select(o.id, o.task_id, o.queue, o.generation, o.delivery, o.attempts, o.shadow, o.created_at)
        .add_columns(t.name, inline_payload(), t.traceparent, t.partition_key, t.priority, t.concurrency_key)
        .add_columns(t.payload_bytes.is_(None))
        .join_from(outbox_table, tasks_table, t.id == o.task_id)
        .where(o.id.in_(ids))
    )


def _fenced(row: ClaimedDelivery) -> dict[str, object]:
    return {"b_id": row.outbox_id, "b_token": row.claim_token}


_FENCE = sa.and_(
    o.id == sa.bindparam("b_id"),
    o.claim_token == sa.bindparam("b_token"),
    o.state == OutboxState.PENDING,
)


def mark_sent(conn: sa.Connection, sent: Sequence[Sent], *, now: datetime) -> int:
    """Record published rows as SENT with their entry ids; their tasks become ENQUEUED.

    Two statements for the whole batch (the first an executemany), each row fenced by its
    claim token. The task moves
    only if it is still PENDING/RETRYING in the same generation and delivery: a worker may
    already have claimed it (RUNNING), and a mark never moves a task backwards.
    """
    if not sent:
        return 0
    marked = conn.execute(
        sa.update(outbox_table)
        .where(_FENCE)
        .values(
            state=OutboxState.SENT,
            stream_id=sa.bindparam("b_stream"),
            partition=sa.bindparam("b_partition"),
            sent_at=now,
            lease_expires_at=None,
        ),
        [{**_fenced(row), "b_stream": stream_id, "b_partition": partition} for row, stream_id, partition in sent],
    ).rowcount
    _enqueued(conn, sent, now)
    return int(marked)


def mark_sent_at_once(conn: sa.Connection, sent: Sequence[Sent], *, now: datetime) -> int:
    """:func:`mark_sent` with the outbox rows in one statement, each row's entry id, partition
    and fencing token picked by its id: for a server where every statement of an executemany
    is a round trip of its own (MySQL/MariaDB: 500 statements for a batch of 500)."""
    if not sent:
        return 0
    by_id = {row.outbox_id: (row.claim_token, stream_id, partition) for row, stream_id, partition in sent}
    marked = conn.execute(
        sa.update(outbox_table)
        .where(
            o.id.in_(list(by_id)),
            o.claim_token == sa.case({i: token for i, (token, _, _) in by_id.items()}, value=o.id),
            o.state == OutboxState.PENDING,
        )
        .values(
            state=OutboxState.SENT,
            stream_id=sa.case({i: stream for i, (_, stream, _) in by_id.items()}, value=o.id),
            partition=sa.case({i: part for i, (_, _, part) in by_id.items()}, value=o.id),
            sent_at=now,
            lease_expires_at=None,
        )
    ).rowcount
    _enqueued(conn, sent, now)
    return int(marked)


def _enqueued(conn: sa.Connection, sent: Sequence[Sent], now: datetime) -> None:
    """The published rows' tasks become ENQUEUED, if still waiting in that delivery."""
    keys = [(r.task_id, r.generation, r.delivery) for r, _, _ in sent]
    conn.execute(_ENQUEUED, {"ids": [task_id for task_id, _, _ in keys], "keys": keys, "at": now})


#: Built once and run with each pass's values (as submit's inserts are: :mod:`.submit`).
_ENQUEUED = (
    sa.update(tasks_table)
    .where(
        t.id.in_(sa.bindparam("ids", expanding=True)),  # the index lookup; the row match below filters
        sa.tuple_(t.id, t.generation, t.delivery).in_(sa.bindparam("keys", expanding=True)),
        t.state.in_([TaskState.PENDING, TaskState.RETRYING]),
    )
    .values(state=TaskState.ENQUEUED, enqueued_at=sa.bindparam("at", type_=t.enqueued_at.type))
)


def mark_dead(conn: sa.Connection, rows: Sequence[Dead], *, now: datetime) -> None:
    """Outbox row DEAD and its task DEAD, keeping the reason (payload invalid, unknown task)."""
    if not rows:
        return
    conn.execute(
        sa.update(outbox_table)
        .where(_FENCE)
        .values(state=OutboxState.DEAD, last_error=sa.bindparam("b_reason"), lease_expires_at=None),
        [{**_fenced(row), "b_reason": reason} for row, reason in rows],
    )
    conn.execute(
        sa.update(tasks_table)
        .where(
            t.id == sa.bindparam("b_task"),
            t.generation == sa.bindparam("b_gen"),
            sa.and_(*(t.state != state for state in TERMINAL_STATES)),  # no IN: executemany
        )
        .values(
            state=TaskState.DEAD,
            error_type=sa.bindparam("b_type"),
            error_message=sa.bindparam("b_reason"),
            finished_at=now,
            lease_expires_at=None,
        ),
        [
            {"b_task": r.task_id, "b_gen": r.generation, "b_reason": reason, "b_type": dead_error_type(reason)}
            for r, reason in rows
        ],
    )


def dead_error_type(reason: str) -> str:
    """The error type a dead-lettered row's task records: its name unknown past the grace, or
    a payload that does not fit its task."""
    return "UnknownTask" if reason.startswith(UNKNOWN_TASK_ERROR) else "InvalidPayload"


def schedule_retry(conn: sa.Connection, rows: Sequence[Retry]) -> None:
    """A publish failed: count the attempt, keep the error, try again at the given time."""
    if not rows:
        return
    conn.execute(
        sa.update(outbox_table)
        .where(_FENCE)
        .values(
            attempts=o.attempts + 1,
            next_attempt_at=sa.bindparam("b_next"),
            last_error=sa.bindparam("b_error"),
            lease_expires_at=None,
        ),
        [{**_fenced(r), "b_next": at, "b_error": err} for r, at, err in rows],
    )


def release(conn: sa.Connection, rows: Sequence[ClaimedDelivery], *, next_attempt_at: datetime) -> None:
    """Give rows back untouched (no transport for their queue): not a failure, no attempt."""
    if not rows:
        return
    conn.execute(
        sa.update(outbox_table).where(_FENCE).values(next_attempt_at=next_attempt_at, lease_expires_at=None),
        [_fenced(r) for r in rows],
    )
