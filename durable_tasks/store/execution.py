"""The worker's SQL for claiming: the execution fence, in batches (the running attempts'
leases and heartbeats are in :mod:`.leases`).

The attempt number a claim hands out is the fencing token: every later write of that
execution names it, and the database refuses the write once a newer attempt or generation
exists. One batch is one transaction however many deliveries it holds; each delivery is
still fenced on its own (generation, delivery, state).

Claimable: the same generation and delivery, in PENDING (the entry can arrive before the
dispatcher's mark-SENT commits), ENQUEUED or RETRYING, or RUNNING whose lease ran out. A
delivery listed twice is claimed once; the other copy is STALE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple

import sqlalchemy as sa

from ..immutable import immutable
from ..records import CLAIMABLE_STATES, AttemptOutcome, TaskState, attempts_table, tasks_table
from .payloads import inline_payload, payload_size
from .planning import attempts_by_task, filter_only, tasks_by_id

__all__ = [
    "CLAIM_VALUES",
    "NOTHING_KNOWN",
    "ClaimRefused",
    "ClaimRequest",
    "ClaimedRow",
    "ExecutionClaim",
    "FollowUps",
    "Known",
    "after_claim",
    "claim_follow_ups",
    "claim_keys",
    "claim_rows",
    "claims_for",
    "close_open_attempts",
    "fenced_rows",
    "open_attempts",
]

t = tasks_table.c
a = attempts_table.c


@immutable
class ExecutionClaim:
    """The right to run one attempt: the fencing token (generation, attempt) and the input."""

    namespace: str
    task_id: str
    name: str
    queue: str
    generation: int
    attempt: int
    delivery: int
    max_attempts: int
    failures: int
    #: The task's payload, or None when it is over :data:`.payloads.INLINE_PAYLOAD_BYTES`: then
    #: the attempt reads it alone (a worker, once its ``payload_memory`` has room for
    #: ``payload_size`` more).
    payload_json: str | None
    idempotency_key: str | None
    traceparent: str | None
    shadow: bool
    created_at: datetime
    enqueued_at: datetime | None
    worker_id: str
    previous_traceparent: str | None = None
    reclaims: int = 0
    #: A child task's parent (``durable_tasks.journal``): its final outcome settles that slot.
    parent_id: str | None = None
    parent_generation: int | None = None
    parent_slot: str | None = None
    #: The payload's size in bytes (characters, on SQLite, for a task written without ``payload_bytes``).
    payload_size: int = 0
    #: Claimed without starting (``dt_tasks.started_at`` NULL): the attempt waits at the worker's
    #: isolation gate (a suspect, or any attempt claimed while the worker isolates), and the
    #: worker records its start (:meth:`~durable_tasks.store.Store.mark_started`) before it runs.
    #: Its worker lost before then ran none of its code: the loss makes it no more suspect.
    held: bool = False

    def fence(self) -> sa.ColumnElement[bool]:
        """The WHERE clause every write of this execution carries: its row found by id alone,
        namespace and state tested on it (:func:`.planning.filter_only`)."""
        return sa.and_(
            t.id == self.task_id,
            filter_only(t.namespace) == self.namespace,
            t.generation == self.generation,
            t.attempt == self.attempt,
            filter_only(t.state) == TaskState.RUNNING,
        )


class ClaimRefused(Enum):
    """Why a delivery may not run."""

    STALE = "stale"  # superseded, duplicate, finished, or held by a live lease: ack and skip
    NO_TASK = "no_task"  # no such task row (yet): leave the entry pending for the reaper


@immutable
class ClaimRequest:
    """One delivery to claim, and the trace context its attempt will record."""

    task_id: str
    generation: int
    delivery: int
    traceparent: str | None = None


class ClaimedRow(NamedTuple):
    """A claimed task row, in the order both claim statements return its columns (read
    positionally: a SQLAlchemy Row's attribute access is slow per column, and a claim reads
    every column of every row)."""

    id: str
    name: str
    queue: str
    attempt: int
    max_attempts: int
    failures: int
    payload: str | None  # None over INLINE_PAYLOAD_BYTES
    idempotency_key: str | None
    traceparent: str | None
    shadow: bool
    created_at: datetime
    enqueued_at: datetime | None
    generation: int
    delivery: int
    reclaims: int
    parent_id: str | None
    parent_generation: int | None
    parent_slot: str | None
    payload_size: int


#: A claimed row's columns (SQLite's and MySQL's claims), a payload over INLINE_PAYLOAD_BYTES as NULL.
CLAIMED_COLUMNS = (
    *(inline_payload() if name == "payload" else t[name] for name in ClaimedRow._fields[:-1]),
    payload_size(),
)
#: What a claim sets on a task row, for a statement built once (SQLite's here, MySQL's): its
#: values are the bind parameters ``until`` (the lease's end), ``worker``, ``now`` and ``hold``
#: (the worker isolates: every attempt of the batch waits at its gate). A held attempt
#: (:attr:`ExecutionClaim.held`: a suspect, or ``hold``) is claimed with no start.
CLAIM_VALUES = {
    "state": TaskState.RUNNING,
    "attempt": t.attempt + 1,
    "lease_expires_at": sa.bindparam("until", type_=t.lease_expires_at.type),
    "worker_id": sa.bindparam("worker", type_=t.worker_id.type),
    "started_at": sa.case(
        (sa.or_(t.reclaims > 0, sa.bindparam("hold", type_=sa.Boolean)), sa.null()),
        else_=sa.bindparam("now", type_=t.started_at.type),
    ),
}


def claim_keys(requests: Sequence[ClaimRequest]) -> tuple[list[tuple[str, int, int]], dict[str, str | None]]:
    """The distinct (task id, generation, delivery) of a read batch, and each task's trace context."""
    return list({(r.task_id, r.generation, r.delivery) for r in requests}), {r.task_id: r.traceparent for r in requests}


class FollowUps(NamedTuple):
    """What a claim leaves to do (rare): its re-runs, and the requested ids it did not claim."""

    reruns: list[ClaimedRow]
    missing: set[str]


class Known(NamedTuple):
    """What the follow-ups found: re-runs' previous trace contexts; unclaimed ids that exist."""

    previous: Mapping[str, str | None]
    existing: AbstractSet[str]


#: The follow-ups' answer when there were none (read-only: shared by every such claim).
NOTHING_KNOWN = Known(MappingProxyType({}), frozenset())


def claim_follow_ups(requests: Sequence[ClaimRequest], rows: Sequence[ClaimedRow]) -> FollowUps | None:
    """The claim's follow-ups, or None when there are none (the usual case: no I/O left)."""
    reruns = [r for r in rows if r.attempt > 1 or r.generation > 0]
    missing = {r.task_id for r in requests} - {r.id for r in rows}
    return FollowUps(reruns, missing) if reruns or missing else None


def claims_for(
    requests: Sequence[ClaimRequest],
    rows: Sequence[ClaimedRow],
    known: Known,
    *,
    namespace: str,
    worker_id: str,
    hold: bool = False,
) -> list[ExecutionClaim | ClaimRefused]:
    """Each request's answer, in request order: its claim, STALE, or NO_TASK (``hold``: as the
    claim was made)."""
    claimed = {r.id: r for r in rows}
    out: list[ExecutionClaim | ClaimRefused] = []
    handed_out: set[str] = set()
    for r in requests:
        row = claimed.get(r.task_id)
        if (
            row is not None
            and r.task_id not in handed_out
            and (row.generation, row.delivery) == (r.generation, r.delivery)
        ):
            handed_out.add(r.task_id)  # a second copy of the same delivery is stale
            # held as CLAIM_VALUES and PostgreSQL's claim statement decide it
            out.append(_claim_from(row, namespace, worker_id, known.previous.get(row.id), hold or row.reclaims > 0))
        elif row is not None or r.task_id in known.existing:
            out.append(ClaimRefused.STALE)
        else:
            out.append(ClaimRefused.NO_TASK)
    return out


def after_claim(conn: sa.Connection, namespace: str, follow_ups: FollowUps, now: datetime) -> Known:
    """After a claim: the previous attempts' trace contexts of re-runs (closing what lost
    workers left open), and which unclaimed task ids name an existing task (STALE, not NO_TASK)."""
    reruns, missing = follow_ups
    previous = _reopened(conn, reruns, now)
    existing = set(conn.execute(sa.select(t.id).where(tasks_by_id(namespace, missing))).scalars()) if missing else set()
    return Known(previous, existing)


def claim_rows(
    conn: sa.Connection,
    namespace: str,
    keys: list[tuple[str, int, int]],
    *,
    worker_id: str,
    now: datetime,
    lease_until: datetime,
    hold: bool = False,
) -> list[ClaimedRow]:
    ids = [key[0] for key in keys]
    claim = {
        "ns": namespace,
        "ids": ids,
        "keys": keys,
        "now": now,
        "until": lease_until,
        "worker": worker_id,
        "hold": hold,
    }
    rows = conn.execute(_CLAIM_ROWS, claim)
    return [ClaimedRow._make(row) for row in rows]


#: SQLite's claim (PostgreSQL's is its own SQL; MySQL, which returns nothing from an UPDATE,
#: locks the rows first), built once and run with each batch's values: built per batch it cost
#: SQLAlchemy about 40 coercions in the claiming thread.
_CLAIM_ROWS = (
    sa.update(tasks_table)
    .where(
        tasks_by_id(sa.bindparam("ns"), sa.bindparam("ids", expanding=True)),
        sa.tuple_(t.id, t.generation, t.delivery).in_(sa.bindparam("keys", expanding=True)),
        sa.or_(
            filter_only(t.state).in_(CLAIMABLE_STATES),
            sa.and_(
                filter_only(t.state) == TaskState.RUNNING,
                t.lease_expires_at <= sa.bindparam("now", type_=t.lease_expires_at.type),
            ),
        ),
    )
    .values(CLAIM_VALUES)
    .returning(*CLAIMED_COLUMNS)
)


def open_attempts(
    conn: sa.Connection,
    namespace: str,
    rows: Sequence[ClaimedRow],
    traceparents: dict[str, str | None],
    *,
    worker_id: str,
    now: datetime,
) -> None:
    if not rows:
        return
    conn.execute(
        sa.insert(attempts_table),
        [
            {
                "namespace": namespace,
                "task_id": r.id,
                "generation": r.generation,
                "attempt": r.attempt,
                "delivery": r.delivery,
                "worker_id": worker_id,
                "started_at": now,
                "traceparent": traceparents[r.id],
            }
            for r in rows
        ],
    )


def _reopened(conn: sa.Connection, rows: Sequence[ClaimedRow], now: datetime) -> dict[str, str | None]:
    """For re-run tasks: close attempts their lost workers left open, and return the last
    attempt's trace context (the new attempt's span links to it)."""
    if not rows:
        return {}
    ids = [r.id for r in rows]
    # The attempts just opened are not "previous" (the claim opened them, in this transaction).
    earlier = sa.tuple_(a.task_id, a.generation, a.attempt).not_in([(r.id, r.generation, r.attempt) for r in rows])
    latest: dict[str, str | None] = {}
    for task_id, traceparent in conn.execute(
        attempts_by_task(sa.select(a.task_id, a.traceparent)).where(a.task_id.in_(ids), earlier).order_by(a.id)
    ):
        latest[task_id] = traceparent
    conn.execute(
        attempts_by_task(sa.update(attempts_table))
        .where(a.task_id.in_(ids), a.outcome.is_(None), earlier)
        .values(outcome=AttemptOutcome.LOST, finished_at=now, retry_reason="lease expired: worker lost")
    )
    return latest


def _claim_from(row: ClaimedRow, namespace: str, worker_id: str, previous: str | None, held: bool) -> ExecutionClaim:
    return ExecutionClaim(
        namespace=namespace,
        task_id=row.id,
        name=row.name,
        queue=row.queue,
        generation=row.generation,
        attempt=row.attempt,
        delivery=row.delivery,
        max_attempts=row.max_attempts,
        failures=row.failures,
        payload_json=row.payload,
        idempotency_key=row.idempotency_key,
        traceparent=row.traceparent,
        shadow=row.shadow,
        created_at=row.created_at,
        enqueued_at=row.enqueued_at,
        worker_id=worker_id,
        previous_traceparent=previous,
        reclaims=row.reclaims,
        parent_id=row.parent_id,
        parent_generation=row.parent_generation,
        parent_slot=row.parent_slot,
        payload_size=row.payload_size,
        held=held,
    )


def close_open_attempts(conn: sa.Connection, task_id: str, generation: int, now: datetime, *, reason: str) -> None:
    """Attempts still open (their worker vanished) end as ``lost`` with the reason."""
    conn.execute(
        sa.update(attempts_table)
        .where(a.task_id == task_id, a.generation == generation, a.outcome.is_(None))
        .values(outcome=AttemptOutcome.LOST, finished_at=now, retry_reason=reason)
    )


def fenced_rows(claims: Sequence[ExecutionClaim]) -> sa.ColumnElement[bool]:
    """:meth:`ExecutionClaim.fence` for many executions at once (each row RUNNING under its own
    generation and attempt); ``claims`` share one namespace."""
    return sa.and_(
        tasks_by_id(claims[0].namespace, [c.task_id for c in claims]),
        sa.tuple_(t.id, t.generation, t.attempt).in_([(c.task_id, c.generation, c.attempt) for c in claims]),
        filter_only(t.state) == TaskState.RUNNING,
    )
