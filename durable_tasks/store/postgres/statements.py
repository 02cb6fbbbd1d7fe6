"""PostgreSQL's hot paths as values: one named statement (``sql/postgres.sql``), its
parameters, and how to read its rows.

The dispatcher's lease and mark-SENT, the worker's batch claim, group commit and lease renewal
are each ONE statement that is its own transaction, sent on the event loop's own connections
(:mod:`.connections`); inside a larger transaction (a pass with dead rows, a group with hooks)
the same statement runs on the transaction's connection (:meth:`OneStatement.run_on`).
Batches travel as parallel arrays, so the statement text never changes.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Generic, NamedTuple, TypeVar

import psycopg
import sqlalchemy as sa

from ...journal_records import ChildOutcome, StepKind
from ...records import AttemptOutcome
from .. import sql
from ..execution import ClaimedRow, ClaimRequest, ExecutionClaim, claim_keys
from ..outbox import ClaimedDelivery, NewDelivery, Sent, deliveries
from ..payloads import INLINE_PAYLOAD_BYTES
from ..results import FinalWrite, set_outcomes

__all__ = [
    "NOTIFY_CHANNEL",
    "PREPARED_GROUP_MAX",
    "OneStatement",
    "Rows",
    "claim_executions",
    "claim_outbox",
    "commit_results",
    "finish_attempts",
    "mark_sent",
    "next_due",
    "record_step",
    "redeliver_lost",
    "renew_leases",
    "resume_if_ready",
    "wait_fenced",
]

R = TypeVar("R")

#: What a statement returns, as plain tuples in the SELECT/RETURNING order.
Rows = list[tuple[Any, ...]]

#: A group commit of at most this many results may run as a prepared statement (psycopg's
#: threshold), whose generic plan tests the whole array once per row: 0.4 us x n^2, 0.1 ms at 16.
#: A larger one is planned per call, knowing its length (0.1-0.4 ms of planning).
PREPARED_GROUP_MAX = 16

#: The channel a submit notifies on commit; the payload is the namespace.
NOTIFY_CHANNEL = "durable_tasks"


@dataclass(frozen=True, slots=True)
class OneStatement(Generic[R]):
    """One PostgreSQL statement run as its own transaction, and the reading of its rows."""

    sql: str
    params: Mapping[str, Any]
    read: Callable[[Rows], R]
    #: False: planned on every call with its parameters' values, never prepared (psycopg
    #: prepares a statement after a few runs, and PostgreSQL then keeps one generic plan for
    #: it); None: psycopg's threshold (``prepare_threshold``).
    prepare: bool | None = None

    def run_on(self, conn: sa.Connection) -> R:
        """Run it inside ``conn``'s transaction (a pass or group that needs more statements)."""
        with _unprepared(conn) if self.prepare is False else contextlib.nullcontext():
            result = conn.exec_driver_sql(self.sql, dict(self.params))
        return self.read([tuple(row) for row in result] if result.returns_rows else [])


@contextlib.contextmanager
def _unprepared(conn: sa.Connection) -> Iterator[None]:
    """Statements sent meanwhile on ``conn`` are not prepared; its own threshold comes back after."""
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection) or driver.prepare_threshold is None:
        yield
        return
    threshold = driver.prepare_threshold
    driver.prepare_threshold = None
    try:
        yield
    finally:
        driver.prepare_threshold = threshold


def claim_outbox(
    namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
) -> OneStatement[tuple[list[ClaimedDelivery], datetime | None]]:
    """Lease due outbox rows and read their tasks (UPDATE … FROM dt_tasks … RETURNING), and
    when the earliest row not due yet will be; the statement turns off the wait for the WAL
    flush itself (see the SQL)."""
    token = str(uuid.uuid4())
    params = {
        "namespaces": [namespace],  # one element: see the SQL
        "now": now,
        "lease_until": now + lease,
        "token": token,
        "limit": limit,
        "watermark": watermark or 0,
        "inline_payload": INLINE_PAYLOAD_BYTES,
    }
    return OneStatement(sql.postgres()["claim_outbox"], params, partial(_leased_and_due, token=token))


def _leased_and_due(rows: Rows, token: str) -> tuple[list[ClaimedDelivery], datetime | None]:
    """The claim's rows without their last column (the next due time, the same in each); a
    claim of nothing is one row of NULLs."""
    due: datetime | None = rows[0][-1]
    return deliveries([row[:-1] for row in rows if row[0] is not None], token), due


def mark_sent(sent: Sequence[Sent], now: datetime) -> OneStatement[int]:
    """Published rows SENT and their tasks ENQUEUED, without waiting for the WAL flush."""
    params = {
        "ids": [row.outbox_id for row, _, _ in sent],
        "tokens": [row.claim_token for row, _, _ in sent],
        "stream_ids": [stream_id for _, stream_id, _ in sent],
        "partitions": [partition for _, _, partition in sent],
        "task_ids": [row.task_id for row, _, _ in sent],
        "generations": [row.generation for row, _, _ in sent],
        "deliveries": [row.delivery for row, _, _ in sent],
        "now": now,
    }
    return OneStatement(sql.postgres()["mark_sent"], params, _first_int)


def _first_int(rows: Rows) -> int:
    return int(rows[0][0])


def claim_executions(
    namespace: str,
    requests: Sequence[ClaimRequest],
    *,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    hold: bool = False,
) -> OneStatement[tuple[list[ClaimedRow], dict[str, str | None]]]:
    """The batch claim: it claims the tasks and opens their attempts (one round trip); reads
    the claimed rows, and the re-runs' earlier trace contexts (:func:`..execution.after_claim`'s
    ``previous``: the statement closed what lost workers left open too)."""
    keys, traceparents = claim_keys(requests)
    ids, generations, delivery_numbers = zip(*keys, strict=True)
    params = {
        "namespace": namespace,
        "ids": list(ids),
        "generations": list(generations),
        "deliveries": list(delivery_numbers),
        "trace_ids": list(traceparents),
        "traceparents": list(traceparents.values()),
        "worker_id": worker_id,
        "now": now,
        "lease_until": now + lease,
        "inline_payload": INLINE_PAYLOAD_BYTES,
        "hold": hold,
    }
    return OneStatement(sql.postgres()["claim_executions"], params, _claimed_rows)


def _claimed_rows(rows: Rows) -> tuple[list[ClaimedRow], dict[str, str | None]]:
    # The last column is NULL but for a re-run whose earlier attempt had a trace context (the
    # statement decides which rows are re-runs; a missing entry reads as None).
    return [ClaimedRow._make(row[:-1]) for row in rows], {row[0]: row[-1] for row in rows if row[-1] is not None}


def commit_results(
    writes: Sequence[FinalWrite], now: datetime, *, parent_ids: Sequence[str] = ()
) -> OneStatement[None]:
    """The fenced writes of results without hooks and their attempts' outcomes, the rows of
    ``parent_ids`` (the children's parents) locked with theirs; reading its rows sets each
    write's ``outcome``."""
    params = {
        **_fence_arrays([w.claim for w in writes]),
        "parent_ids": list(parent_ids),
        "namespace": writes[0].claim.namespace,
        "results": [w.result_json for w in writes],
        "now": now,
    }
    return OneStatement(
        sql.postgres()["commit_results"],
        params,
        lambda rows: set_outcomes(writes, {task_id for (task_id,) in rows}),
        # A large group's plan needs the arrays' length (see the SQL); a small one's is cheap
        # either way, and a prepared statement saves it the parse and plan (0.1 ms of 0.5).
        prepare=None if len(writes) <= PREPARED_GROUP_MAX else False,
    )


def finish_attempts(closed: Sequence[tuple[FinalWrite, str]], now: datetime) -> OneStatement[None]:
    """Close attempts, each with its own outcome."""
    params = {
        **_fence_arrays([w.claim for w, _ in closed]),
        "outcomes": [outcome for _, outcome in closed],
        "now": now,
    }
    return OneStatement(sql.postgres()["finish_attempts"], params, _nothing)


def _nothing(rows: Rows) -> None:
    return None


def renew_leases(claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> OneStatement[set[str]]:
    """Extend the leases of running attempts; reads the task ids still held."""
    params = {**_fence_arrays(claims), "namespace": claims[0].namespace, "lease_until": now + lease}
    return OneStatement(sql.postgres()["renew_leases"], params, _task_ids)


def _task_ids(rows: Rows) -> set[str]:
    return {row[0] for row in rows}


def resume_if_ready(
    namespace: str,
    task_id: str,
    generation: int,
    now: datetime,
    *,
    settle: tuple[str, ChildOutcome] | None = None,
) -> OneStatement[NewDelivery | None]:
    """:func:`..journal.resume_if_ready` in one statement, or with ``settle`` (a slot and a
    child's outcome) :func:`..journal.settle_child`; reads the new delivery, or None."""
    slot, outcome = settle if settle is not None else (None, None)
    params = {
        "namespace": namespace,
        "task_id": task_id,
        "generation": generation,
        "now": now,
        "channel": NOTIFY_CHANNEL,
        "slot": slot,
        "state": outcome and outcome.state,
        "result": outcome and outcome.result_json,
        "error_type": outcome and outcome.error_type,
        "error_message": outcome and outcome.error_message,
    }
    return OneStatement(sql.postgres()["resume_if_ready"], params, _resumed)


def _resumed(rows: Rows) -> NewDelivery | None:
    return NewDelivery(*rows[0][: len(fields(NewDelivery))]) if rows else None


class StepRecord(NamedTuple):
    """What :func:`record_step` read: whether the fence held, whether the step's row went in,
    and the slot's result as the statement saw it (None: no row, or one it could not see)."""

    owned: bool
    inserted: bool
    existing: str | None


def record_step(
    claim: ExecutionClaim, slot: str, label: str, result_json: str, *, now: datetime, lease: timedelta
) -> OneStatement[StepRecord]:
    """:func:`..journal.record_step` in one statement (the fence's UPDATE and the step's INSERT)."""
    params = {
        "namespace": claim.namespace,
        "task_id": claim.task_id,
        "generation": claim.generation,
        "attempt": claim.attempt,
        "lease_until": now + lease,
        "slot": slot,
        "kind": StepKind.STEP.value,
        "label": label[:200],
        "result": result_json,
        "now": now,
    }
    return OneStatement(sql.postgres()["record_step"], params, _step_record)


def _step_record(rows: Rows) -> StepRecord:
    owned, inserted, existing = rows[0]
    return StepRecord(bool(owned), bool(inserted), existing)


def wait_fenced(claim: ExecutionClaim, now: datetime) -> OneStatement[bool]:
    """:func:`..journal.wait_fenced` in one statement; reads whether the fence held."""
    params = {
        "namespace": claim.namespace,
        "task_id": claim.task_id,
        "generation": claim.generation,
        "attempt": claim.attempt,
        "outcome": AttemptOutcome.SUSPENDED.value,
        "now": now,
    }
    return OneStatement(sql.postgres()["wait_fenced"], params, bool)


def redeliver_lost(
    namespace: str, lost: Sequence[tuple[str, int, int]], *, now: datetime, reason: str, count_reclaim: bool
) -> OneStatement[set[tuple[str, int, int]]]:
    """Supersede lost deliveries nobody holds (:func:`..recovery.redeliver_many`); reads the
    keys ``(task_id, generation, delivery)`` superseded."""
    ids, generations, delivery_numbers = zip(*lost, strict=True)
    params = {
        "namespace": namespace,
        "ids": list(ids),
        "generations": list(generations),
        "deliveries": list(delivery_numbers),
        "count_reclaim": count_reclaim,
        "reason": reason,
        "now": now,
    }
    return OneStatement(sql.postgres()["redeliver_lost"], params, _keys)


def _keys(rows: Rows) -> set[tuple[str, int, int]]:
    return {(row[0], row[1], row[2]) for row in rows}


def next_due(namespace: str, now: datetime) -> OneStatement[datetime | None]:
    """When the earliest PENDING row not due at ``now`` will be (one index probe)."""
    return OneStatement(sql.postgres()["next_due"], {"namespaces": [namespace], "now": now}, _first_or_none)


def _first_or_none(rows: Rows) -> datetime | None:
    return rows[0][0] if rows else None


def _fence_arrays(claims: Sequence[ExecutionClaim]) -> dict[str, list[Any]]:
    """Executions' fencing tokens as parallel arrays."""
    return {
        "ids": [c.task_id for c in claims],
        "generations": [c.generation for c in claims],
        "attempts": [c.attempt for c in claims],
    }
