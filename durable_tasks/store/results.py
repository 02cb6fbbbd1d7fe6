"""The worker's SQL for outcomes: fenced final writes (in groups) and fenced failures.

A group of results commits in ONE transaction, each row fenced on its own: results without
an on-commit hook go through one fenced UPDATE for the whole group; a result with a hook gets
a savepoint, so a stale row or a raising hook affects only its own task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

import sqlalchemy as sa

from ..records import AttemptOutcome, TaskState, attempts_table, tasks_table
from . import sql
from .engine import is_postgres
from .execution import ExecutionClaim, fence_arrays, fenced_rows
from .locking import lock_tasks_in_order
from .statement import OneStatement
from .submit import insert_outbox

__all__ = ["CommitOutcome", "FinalWrite", "commit_results", "commit_statement", "record_failure"]

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


_SUCCEEDED = {
    "state": TaskState.SUCCEEDED,
    "lease_expires_at": None,
    "error_type": None,
    "error_message": None,
}


def commit_results(engine: sa.Engine, writes: Sequence[FinalWrite], *, now: datetime) -> None:
    """Commit several results in ONE transaction, each fenced on its own; sets each ``outcome``
    (HOOK_FAILED with ``hook_error`` when an on-commit hook raised: that task is rolled back)."""
    if is_postgres(engine) and (alone := commit_statement(writes, now=now)):
        alone.run(engine)
        return
    plain = [w for w in writes if _plain(w)]
    hooked = [w for w in writes if not _plain(w)]
    with engine.begin() as conn:
        if hooked:  # several statements: take every row's lock first, in id order
            lock_tasks_in_order(conn, [w.claim.task_id for w in writes])
        if plain:
            _commit_plain(conn, plain, now)
        for w in hooked:
            _commit_hooked(conn, w, now)
        # On Postgres the plain writes' statement closed their attempts too.
        _finish_attempts(conn, hooked if is_postgres(conn) else writes, now)


def commit_statement(writes: Sequence[FinalWrite], *, now: datetime) -> OneStatement[None] | None:
    """A group without on-commit hooks as ONE PostgreSQL statement, its own transaction: the
    fenced writes and their attempts' outcomes; reading its rows sets each ``outcome``. None
    when a hook needs :func:`commit_results`' transaction (savepoints)."""
    return _results_statement(writes, now) if all(_plain(w) for w in writes) else None


def _results_statement(writes: Sequence[FinalWrite], now: datetime) -> OneStatement[None]:
    """PostgreSQL's fenced writes of plain results and their attempts' outcomes, one statement."""
    return OneStatement(
        sql.postgres()["commit_results"],
        _results_params(writes, now),
        lambda rows: _set_outcomes(writes, {task_id for (task_id,) in rows}),
    )


def _plain(w: FinalWrite) -> bool:
    return w.hook is None or w.claim.shadow  # a shadow run's hook never runs


def _commit_plain(conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> None:
    if is_postgres(conn):
        _results_statement(writes, now).run_on(conn)
    else:
        _set_outcomes(writes, _write_results(conn, writes, now))


def _set_outcomes(writes: Sequence[FinalWrite], committed: set[str]) -> None:
    for w in writes:
        w.outcome = CommitOutcome.COMMITTED if w.claim.task_id in committed else CommitOutcome.FENCED_OUT


def _write_results(conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> set[str]:
    return set(
        conn.execute(
            sa.update(tasks_table)
            .where(fenced_rows([w.claim for w in writes]))
            .values(
                **_SUCCEEDED,
                finished_at=now,
                result=sa.case({w.claim.task_id: w.result_json for w in writes}, value=t.id),
            )
            .returning(t.id)
        ).scalars()
    )


def _results_params(writes: Sequence[FinalWrite], now: datetime) -> dict[str, Any]:
    return {
        **fence_arrays([w.claim for w in writes]),
        "namespace": writes[0].claim.namespace,
        "results": [w.result_json for w in writes],
        "now": now,
    }


def _commit_hooked(conn: sa.Connection, w: FinalWrite, now: datetime) -> None:
    savepoint = conn.begin_nested()
    updated = conn.execute(
        sa.update(tasks_table).where(w.claim.fence()).values(**_SUCCEEDED, finished_at=now, result=w.result_json)
    ).rowcount
    if not updated:
        savepoint.rollback()
        w.outcome = CommitOutcome.FENCED_OUT
        return
    assert w.hook is not None
    try:
        w.hook(conn)
    except Exception as exc:
        savepoint.rollback()
        w.outcome, w.hook_error = CommitOutcome.HOOK_FAILED, exc
        return
    savepoint.commit()
    w.outcome = CommitOutcome.COMMITTED


def _finish_attempts(conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> None:
    """Close the attempts of a committed group, each with its own outcome."""
    closed: list[tuple[FinalWrite, str]] = []
    for w in writes:
        if w.outcome is CommitOutcome.COMMITTED or w.outcome is CommitOutcome.FENCED_OUT:
            closed.append((w, _ATTEMPT_OUTCOME[w.outcome]))
    if not closed:
        return
    if is_postgres(conn):
        params = {
            **fence_arrays([w.claim for w, _ in closed]),
            "outcomes": [outcome for _, outcome in closed],
            "now": now,
        }
        conn.exec_driver_sql(sql.postgres()["finish_attempts"], params)
        return
    for outcome in {outcome for _, outcome in closed}:
        tokens = [(w.claim.task_id, w.claim.generation, w.claim.attempt) for w, o in closed if o == outcome]
        conn.execute(
            sa.update(attempts_table)
            .where(sa.tuple_(a.task_id, a.generation, a.attempt).in_(tokens))
            .values(outcome=outcome, finished_at=now)
        )


_ATTEMPT_OUTCOME = {
    CommitOutcome.COMMITTED: AttemptOutcome.SUCCEEDED.value,
    CommitOutcome.FENCED_OUT: AttemptOutcome.FENCED_OUT.value,
}


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
