"""The worker's SQL for outcomes: fenced final writes (in groups) and fenced failures.

A group of results commits in ONE transaction, each row fenced on its own: results without
an on-commit hook go through one fenced UPDATE for the whole group; a result with a hook gets
a savepoint, so a stale row or a raising hook affects only its own task. SQLAlchemy Core on a
connection whose transaction the store opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

import sqlalchemy as sa

from ..records import AttemptOutcome, TaskState, attempts_table, tasks_table
from .execution import ExecutionClaim, fenced_rows
from .outbox import NewDelivery
from .planning import attempts_by_task
from .submit import insert_outbox

__all__ = [
    "CommitOutcome",
    "FinalWrite",
    "RecordedFailure",
    "closed_attempts",
    "commit_hooked",
    "finish_attempts",
    "plain",
    "record_failure",
    "set_outcomes",
    "write_results",
]

t = tasks_table.c
a = attempts_table.c
logger = logging.getLogger(__name__)


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
    #: The parent this child's commit resumed: its new delivery, which the worker publishes.
    resumed: NewDelivery | None = None


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """A failed attempt recorded under its fence; for a child's final failure, the parent's
    new delivery when that failure was the last thing the parent waited for."""

    resumed: NewDelivery | None = None


SUCCEEDED = {
    "state": TaskState.SUCCEEDED,
    "lease_expires_at": None,
    "error_type": None,
    "error_message": None,
}


def runs_hook(w: FinalWrite) -> bool:
    """Whether the write's commit runs an on-commit hook (one is registered, and the run is not
    a shadow's, whose hooks never run)."""
    return w.hook is not None and not w.claim.shadow


def plain(w: FinalWrite) -> bool:
    """A write whose commit runs no hook and settles no parent (a child task's result goes
    into its parent's journal): its statement is all its transaction does."""
    return not runs_hook(w) and w.claim.parent_id is None


def set_outcomes(writes: Sequence[FinalWrite], committed: set[str]) -> None:
    """COMMITTED for the writes whose task ids were written, FENCED_OUT for the others."""
    for w in writes:
        w.outcome = CommitOutcome.COMMITTED if w.claim.task_id in committed else CommitOutcome.FENCED_OUT


def write_results(conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> set[str]:
    """The fenced writes of results without hooks, one UPDATE … RETURNING; the ids written."""
    return set(
        conn.execute(
            sa.update(tasks_table)
            .where(fenced_rows([w.claim for w in writes]))
            .values(
                **SUCCEEDED,
                finished_at=now,
                result=sa.case({w.claim.task_id: w.result_json for w in writes}, value=t.id),
            )
            .returning(t.id)
        ).scalars()
    )


def commit_hooked(conn: sa.Connection, w: FinalWrite, now: datetime) -> None:
    """One result with an on-commit hook, in a savepoint: a stale row or a raising hook
    affects only its own task."""
    savepoint = conn.begin_nested()
    updated = conn.execute(
        sa.update(tasks_table).where(w.claim.fence()).values(**SUCCEEDED, finished_at=now, result=w.result_json)
    ).rowcount
    if not updated:
        savepoint.rollback()
        w.outcome = CommitOutcome.FENCED_OUT
        return
    try:
        if w.hook is not None and not w.claim.shadow:
            w.hook(conn)
    except Exception as exc:
        savepoint.rollback()
        w.outcome, w.hook_error = CommitOutcome.HOOK_FAILED, exc
        return
    savepoint.commit()
    w.outcome = CommitOutcome.COMMITTED


def closed_attempts(writes: Sequence[FinalWrite]) -> list[tuple[FinalWrite, str]]:
    """The writes whose attempts a committed group closes, each with its attempt's outcome."""
    return [
        (w, _ATTEMPT_OUTCOME[w.outcome])
        for w in writes
        if w.outcome is CommitOutcome.COMMITTED or w.outcome is CommitOutcome.FENCED_OUT
    ]


def finish_attempts(conn: sa.Connection, closed: Sequence[tuple[FinalWrite, str]], now: datetime) -> None:
    """Close the attempts of a committed group, each with its own outcome (one UPDATE per outcome)."""
    for outcome in {outcome for _, outcome in closed}:
        tokens = [(w.claim.task_id, w.claim.generation, w.claim.attempt) for w, o in closed if o == outcome]
        ids = [task_id for task_id, _, _ in tokens]
        conn.execute(_CLOSE_ATTEMPTS, {"ids": ids, "tokens": tokens, "closed": outcome, "at": now})


#: Built once and run per group commit (as submit's inserts are: :mod:`.submit`).
_CLOSE_ATTEMPTS = (
    attempts_by_task(sa.update(attempts_table))
    .where(
        a.task_id.in_(sa.bindparam("ids", expanding=True)),  # by ix_dt_attempts_task
        sa.tuple_(a.task_id, a.generation, a.attempt).in_(sa.bindparam("tokens", expanding=True)),
    )
    .values(outcome=sa.bindparam("closed"), finished_at=sa.bindparam("at", type_=a.finished_at.type))
)


_ATTEMPT_OUTCOME = {
    CommitOutcome.COMMITTED: AttemptOutcome.SUCCEEDED.value,
    CommitOutcome.FENCED_OUT: AttemptOutcome.FENCED_OUT.value,
}


def record_failure(
    conn: sa.Connection,
    claim: ExecutionClaim,
    *,
    now: datetime,
    error_type: str,
    error_message: str,
    retry_at: datetime | None,
    on_failed: Callable[[sa.Connection], None] | None = None,
    traceback: str | None = None,
    in_hook: bool = False,
) -> bool:
    """Record a failed attempt: RETRYING with a new delivery at ``retry_at``, or FAILED.

    Fenced like a result: False (and outcome ``fenced_out``) when a newer execution owns
    the task. ``on_failed`` runs inside the same transaction when the failure is final; if
    it raises, its writes are rolled back and the task is FAILED all the same. A retry's
    delivery intent is written here (the store wakes dispatchers). The attempt keeps
    ``traceback``; its outcome is ``hook_failed`` when the on_commit hook raised (``in_hook``).
    """
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
    # Under the fence the row's delivery is the claim's: the retry's is the next one.
    if not conn.execute(sa.update(tasks_table).where(claim.fence()).values(values)).rowcount:
        _finish_attempt(conn, claim, now, AttemptOutcome.FENCED_OUT, error_type, error_message, traceback=traceback)
        return False
    where = " in the on_commit hook" if in_hook else ""
    reason = None if final else f"retry at {retry_at:%Y-%m-%dT%H:%M:%S} after {error_type}{where}"
    outcome = AttemptOutcome.HOOK_FAILED if in_hook else AttemptOutcome.FAILED
    _finish_attempt(conn, claim, now, outcome, error_type, error_message, reason, traceback=traceback)
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
            claim.delivery + 1,
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
    *,
    traceback: str | None = None,
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
            traceback=traceback,
        )
    )
