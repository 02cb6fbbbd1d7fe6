"""The worker's SQL: the execution fence, heartbeats, and fenced final writes.

The attempt number handed out by :func:`claim_execution` is the fencing token: every later
write of that execution names it, and the database refuses the write once a newer attempt
or generation exists. The on-commit hook runs inside the fenced transaction, so it is fenced
too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

import sqlalchemy as sa

from ..records import CLAIMABLE_STATES, AttemptOutcome, TaskState, attempts_table, tasks_table
from .submit import insert_outbox

__all__ = [
    "ClaimRefused",
    "CommitOutcome",
    "ExecutionClaim",
    "FinalWrite",
    "claim_execution",
    "close_open_attempts",
    "commit_results",
    "heartbeat",
    "record_failure",
]

t = tasks_table.c
a = attempts_table.c
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
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
    payload_json: str
    idempotency_key: str | None
    traceparent: str | None
    shadow: bool
    created_at: datetime
    enqueued_at: datetime | None
    worker_id: str
    previous_traceparent: str | None = None

    def fence(self) -> sa.ColumnElement[bool]:
        """The WHERE clause every write of this execution carries."""
        return sa.and_(
            t.id == self.task_id,
            t.namespace == self.namespace,
            t.generation == self.generation,
            t.attempt == self.attempt,
            t.state == TaskState.RUNNING,
        )


class ClaimRefused(Enum):
    """Why a delivery may not run."""

    STALE = "stale"  # superseded, duplicate, finished, or held by a live lease: ack and skip
    NO_TASK = "no_task"  # no such task row (yet): leave the entry pending for the reaper


def claim_execution(
    engine: sa.Engine,
    namespace: str,
    *,
    task_id: str,
    generation: int,
    delivery: int,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    traceparent: str | None = None,
) -> ExecutionClaim | ClaimRefused:
    """Take the execution fence for one delivery, or say why it may not run.

    Claimable: the same generation and delivery, in PENDING (the entry can arrive before
    the dispatcher's mark-SENT commits), ENQUEUED or RETRYING, or RUNNING whose lease ran out.
    """
    with engine.begin() as conn:
        row = conn.execute(
            sa.update(tasks_table)
            .where(
                t.id == task_id,
                t.namespace == namespace,
                t.generation == generation,
                t.delivery == delivery,
                sa.or_(
                    t.state.in_(CLAIMABLE_STATES),
                    sa.and_(t.state == TaskState.RUNNING, t.lease_expires_at <= now),
                ),
            )
            .values(
                state=TaskState.RUNNING,
                attempt=t.attempt + 1,
                lease_expires_at=now + lease,
                worker_id=worker_id,
                started_at=now,
            )
            .returning(
                t.name,
                t.queue,
                t.attempt,
                t.max_attempts,
                t.failures,
                t.payload,
                t.idempotency_key,
                t.traceparent,
                t.shadow,
                t.created_at,
                t.enqueued_at,
            )
        ).one_or_none()
        if row is None:
            found = conn.execute(sa.select(t.id).where(t.id == task_id, t.namespace == namespace)).first()
            return ClaimRefused.STALE if found else ClaimRefused.NO_TASK
        close_open_attempts(conn, task_id, generation, now, reason="lease expired: worker lost")
        previous = None
        if row.attempt > 1 or generation > 0:  # a first attempt has nothing to link to
            previous = conn.execute(
                sa.select(a.traceparent).where(a.task_id == task_id).order_by(a.id.desc()).limit(1)
            ).scalar_one_or_none()
        conn.execute(
            sa.insert(attempts_table).values(
                namespace=namespace,
                task_id=task_id,
                generation=generation,
                attempt=row.attempt,
                delivery=delivery,
                worker_id=worker_id,
                traceparent=traceparent,
                started_at=now,
            )
        )
    return ExecutionClaim(
        namespace=namespace,
        task_id=task_id,
        name=row.name,
        queue=row.queue,
        generation=generation,
        attempt=row.attempt,
        delivery=delivery,
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
    )


def close_open_attempts(conn: sa.Connection, task_id: str, generation: int, now: datetime, *, reason: str) -> None:
    """Attempts still open (their worker vanished) end as ``lost`` with the reason."""
    conn.execute(
        sa.update(attempts_table)
        .where(a.task_id == task_id, a.generation == generation, a.outcome.is_(None))
        .values(outcome=AttemptOutcome.LOST, finished_at=now, retry_reason=reason)
    )


def heartbeat(engine: sa.Engine, claim: ExecutionClaim, *, now: datetime, lease: timedelta) -> bool:
    """Extend the lease; False means this execution has been fenced out."""
    with engine.begin() as conn:
        updated = conn.execute(
            sa.update(tasks_table).where(claim.fence()).values(lease_expires_at=now + lease)
        ).rowcount
    return bool(updated)


class CommitOutcome(Enum):
    """What became of one final write."""

    COMMITTED = "committed"
    FENCED_OUT = "fenced_out"
    HOOK_FAILED = "hook_failed"


@dataclass(slots=True)
class FinalWrite:
    """A successful execution's result, waiting for its fenced commit."""

    claim: ExecutionClaim
    result_json: str
    hook: Callable[[sa.Connection], None] | None = None
    outcome: CommitOutcome | None = None
    hook_error: BaseException | None = None


def commit_results(engine: sa.Engine, writes: Sequence[FinalWrite], *, now: datetime) -> None:
    """Commit several results in ONE transaction, each fenced on its own.

    Every write runs in a savepoint: a stale row is dropped alone, and an on-commit hook that
    raises rolls back only its own task (its ``outcome`` says HOOK_FAILED, ``hook_error`` why).
    """
    with engine.begin() as conn:
        for w in writes:
            savepoint = conn.begin_nested()
            updated = conn.execute(
                sa.update(tasks_table)
                .where(w.claim.fence())
                .values(
                    state=TaskState.SUCCEEDED,
                    result=w.result_json,
                    finished_at=now,
                    lease_expires_at=None,
                    error_type=None,
                    error_message=None,
                )
            ).rowcount
            if not updated:
                savepoint.rollback()
                w.outcome = CommitOutcome.FENCED_OUT
                _finish_attempt(conn, w.claim, now, AttemptOutcome.FENCED_OUT)
                continue
            if w.hook is not None and not w.claim.shadow:
                try:
                    w.hook(conn)
                except Exception as exc:
                    savepoint.rollback()
                    w.outcome, w.hook_error = CommitOutcome.HOOK_FAILED, exc
                    continue
            _finish_attempt(conn, w.claim, now, AttemptOutcome.SUCCEEDED)
            savepoint.commit()
            w.outcome = CommitOutcome.COMMITTED


def record_failure(
    engine: sa.Engine,
    claim: ExecutionClaim,
    *,
    now: datetime,
    error_type: str,
    error_message: str,
    retry_at: datetime | None,
    on_failed: Callable[[sa.Connection], None] | None = None,
) -> bool:
    """Record a failed attempt: RETRYING with a new delivery at ``retry_at``, or FAILED.

    Fenced like a result: False (and outcome ``fenced_out``) when a newer execution owns
    the task. ``on_failed`` runs inside the same transaction when the failure is final; if
    it raises, its writes are rolled back and the task is FAILED all the same.
    """
    with engine.begin() as conn:
        final = retry_at is None
        values: dict[str, object] = {
            "error_type": error_type[:200],
            "error_message": error_message,
            "lease_expires_at": None,
        }
        if final:
            values |= {"state": TaskState.FAILED, "finished_at": now, "failures": t.failures + 1}
        else:
            values |= {"state": TaskState.RETRYING, "delivery": t.delivery + 1, "failures": t.failures + 1}
        row = conn.execute(
            sa.update(tasks_table).where(claim.fence()).values(values).returning(t.delivery)
        ).one_or_none()
        if row is None:
            _finish_attempt(conn, claim, now, AttemptOutcome.FENCED_OUT, error_type, error_message)
            return False
        reason = None if final else f"retry at {retry_at:%Y-%m-%dT%H:%M:%S} after {error_type}"
        _finish_attempt(conn, claim, now, AttemptOutcome.FAILED, error_type, error_message, reason)
        if final and on_failed is not None and not claim.shadow:
            savepoint = conn.begin_nested()
            try:
                on_failed(conn)
                savepoint.commit()
            except Exception:
                savepoint.rollback()
                logger.exception("on_failure hook of task %s raised; the task is FAILED regardless", claim.task_id)
        if retry_at is not None:
            insert_outbox(
                conn,
                claim.namespace,
                claim.task_id,
                claim.queue,
                claim.generation,
                row.delivery,
                claim.shadow,
                now,
                due=retry_at,
            )
    return True


def _finish_attempt(
    conn: sa.Connection,
    claim: ExecutionClaim,
    now: datetime,
    outcome: AttemptOutcome,
    error_type: str | None = None,
    error_message: str | None = None,
    retry_reason: str | None = None,
) -> None:
    conn.execute(
        sa.update(attempts_table)
        .where(
            a.task_id == claim.task_id,
            a.generation == claim.generation,
            a.attempt == claim.attempt,
        )
        .values(
            outcome=outcome,
            finished_at=now,
            error_type=error_type,
            error_message=error_message,
            retry_reason=retry_reason,
        )
    )
