"""What the dialects' stores share: the store's transactions around the Core statements of
:mod:`.submit`, :mod:`.outbox`, :mod:`.execution`, :mod:`.results`, :mod:`.leases`,
:mod:`.recovery`, :mod:`.queries` and :mod:`.retention`, each run in a worker thread.

A dialect's store subclasses :class:`SqlStore` and overrides what its database does
differently: the hooks (how a task is inserted and a duplicate idempotency key ignored, how
dispatchers are woken, how rows are locked before a multi-statement write) and, where it has a faster way,
whole operations (PostgreSQL's one-statement hot paths on the event loop's own connections).
The Core statements use ``UPDATE … RETURNING``, which SQLite and PostgreSQL both have; MySQL's
store replaces the operations that use it (lock the rows, update, read back). The writes in
the caller's transaction (submit, rerun, cancel) are :class:`~.submitting.SubmitStore`'s, the
reaper's operations :class:`~.recovering.RecoveryStore`'s, the journal's
:class:`~.journaling.JournalStore`'s.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import TypeVar

import anyio
import sqlalchemy as sa

from ..journal import ChildOutcome
from ..outcome import TaskOutcome
from ..records import AttemptRecord, TaskRecord, tasks_table
from . import execution, leases, outbox, outcomes, payloads, queries, results, retention, schema
from .commit_wakes import CommitWakes
from .engine import read_only
from .execution import ClaimRefused, ClaimRequest, ExecutionClaim
from .journaling import JournalStore
from .notify import OutboxWaiter, PollingWaiter
from .outbox import ClaimedDelivery, Dead, Retry, Sent
from .protocol import DatabaseFacts
from .recovering import RecoveryStore
from .results import FinalWrite
from .retention import PruneReport
from .submitting import SubmitStore

__all__ = ["SqlStore"]

logger = logging.getLogger(__name__)

R = TypeVar("R")


class SqlStore(CommitWakes, SubmitStore, RecoveryStore, JournalStore):
    """The operations of :class:`~.protocol.Store` in SQLAlchemy Core, each in a worker thread."""

    #: Dispatchers poll (the runtime adds a wake-up on Redis); PostgreSQL's store NOTIFYs.
    notifies_dispatchers = False
    #: The share of the time a paced prune's transactions may hold the database: a quarter
    #: (store/retention.py; why, and what it costs: docs/performance.md#a-paced-prune).
    prune_duty = 0.25

    #: Whether this dialect writes payloads over ``ASIDE_PAYLOAD_BYTES`` to ``dt_payloads``
    #: once the schema allows it (:mod:`.payloads`).
    keeps_payloads_aside = True

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._read_engine = read_only(engine)
        self.aside_gate = payloads.AsideGate(engine) if self.keeps_payloads_aside else None

    @property
    def engine(self) -> sa.Engine:
        """The application's engine."""
        return self._engine

    @property
    def read_engine(self) -> sa.Engine:
        """The engine for read-only work."""
        return self._read_engine

    @property
    def runtime_engine(self) -> sa.Engine:
        """The engine of the runtime's own periodic transactions that run no application code
        (heartbeats, the reaper's reads): the application's unless a dialect plans them apart."""
        return self._engine

    # -- what dialects do differently --------------------------------------------------------

    def _lock_tasks(self, conn: sa.Connection, task_ids: Sequence[str]) -> None:
        """Lock these task rows in id order before a transaction updates them in several
        statements (default: nothing; the dialect serializes writers)."""

    def _mark_sent(self, conn: sa.Connection, sent: Sequence[Sent], now: datetime) -> int:
        return outbox.mark_sent(conn, sent, now=now)

    #: Whether :meth:`_commit_plain` locks the writes' rows and their parents' first, in one
    #: pass in id order (PostgreSQL's one statement), so a group without hooks needs no
    #: :meth:`_lock_with_parents` before it.
    commit_plain_locks_parents = False

    def _commit_plain(self, conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> list[FinalWrite]:
        """Write a group's results that have no hooks, fenced; returns the writes whose attempts
        are still open (closed with the hooked ones' by :meth:`_finish_attempts`)."""
        results.set_outcomes(writes, results.write_results(conn, writes, now))
        return list(writes)

    def _finish_attempts(self, conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> None:
        closed = results.closed_attempts(writes)
        if closed:
            results.finish_attempts(conn, closed, now)

    def _server_now(self, conn: sa.Connection) -> datetime | None:
        return None

    # -- the App's own -----------------------------------------------------------------------

    def create_all(self, tables: Sequence[sa.Table]) -> None:
        """Create ``tables`` where they do not exist."""
        schema.create_all(self._engine, tables)

    def load_task(self, namespace: str, task_id: str) -> tuple[TaskRecord, list[AttemptRecord]] | None:
        """The task row and its attempts."""
        with self._read_engine.connect() as conn:
            return queries.load_task(conn, namespace, task_id)

    def prune(
        self,
        namespace: str,
        *,
        before: datetime,
        batch: int,
        max_batches: int,
        paced: bool = True,
        min_rate: float = 0.0,
    ) -> PruneReport:
        """Delete settled outbox rows and old final tasks, in batches (paced by ``prune_duty``
        down to ``min_rate`` tasks a second, unless not ``paced``)."""
        duty = self.prune_duty if paced else 1.0
        return retention.prune(
            self._engine, namespace, before=before, batch=batch, max_batches=max_batches, duty=duty, min_rate=min_rate
        )

    async def facts(self) -> DatabaseFacts:
        """The server's clock and the runtime's indexes the database lacks."""

        def read() -> DatabaseFacts:
            with self._engine.connect() as conn:
                now = self._server_now(conn)
            return DatabaseFacts(now=now, indexes_missing=schema.missing_indexes(self._engine))

        return await self._in_thread(read)

    # -- the dispatcher ----------------------------------------------------------------------

    async def lease_outbox(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> list[ClaimedDelivery]:
        """Lease due outbox rows in one transaction."""
        token = str(uuid.uuid4())

        def lease_rows() -> list[ClaimedDelivery]:
            with self._engine.begin() as conn:
                rows = outbox.claim_rows(conn, namespace, token, now=now, lease=lease, limit=limit, watermark=watermark)
            return outbox.deliveries(rows, token)

        return await self._in_thread(lease_rows)

    async def lease_outbox_and_next_due(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> tuple[list[ClaimedDelivery], datetime | None]:
        """The lease and the next-due probe at once, each in its own thread and transaction
        (the probe reads rows due later, which the lease neither takes nor changes). The lease's
        error is raised as itself; a failed probe answers None (the caller sleeps its longest,
        and its next claim reports the outage)."""
        due: datetime | None = None

        async def probe() -> None:
            nonlocal due
            try:
                due = await self.next_due(namespace, now=now)
            except Exception as exc:
                logger.debug("reading the next due time failed: %s", exc)

        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            try:
                rows = await self.lease_outbox(namespace, now=now, lease=lease, limit=limit, watermark=watermark)
            except Exception as exc:
                failed = exc
        if failed is not None:
            raise failed
        return rows, due

    async def read_payload(self, task_id: str) -> str | None:
        """One task's payload, in a thread (a dispatcher's leased rows and a worker's claims carry
        payloads up to ``INLINE_PAYLOAD_BYTES`` only: :mod:`.payloads`)."""

        def read() -> str | None:
            with self._read_engine.connect() as conn:
                payload: str | None = conn.execute(
                    sa.select(payloads.stored_payload()).where(tasks_table.c.id == task_id)
                ).scalar()
                return payload

        return await self._in_thread(read)

    async def settle_outbox(
        self,
        *,
        sent: Sequence[Sent],
        dead: Sequence[Dead],
        retry: Sequence[Retry],
        held: Sequence[ClaimedDelivery],
        now: datetime,
        release_at: datetime,
    ) -> int:
        """Record a pass's outcomes in ONE transaction."""

        def settle() -> int:
            with self._engine.begin() as conn:
                children = self._lock_children_to_dead_letter(conn, sent, dead)
                marked = self._mark_sent(conn, sent, now)
                outbox.mark_dead(conn, dead, now=now)
                for namespace, task_id in children:
                    self._settle_if_child(conn, namespace, task_id, "DEAD", now)
                outbox.schedule_retry(conn, retry)
                outbox.release(conn, held, next_attempt_at=release_at)
            return marked

        return await self._in_thread(settle)

    async def next_due(self, namespace: str, *, now: datetime) -> datetime | None:
        """One probe of ix_dt_outbox_pending_due."""

        def probe() -> datetime | None:
            with self._read_engine.connect() as conn:
                return outbox.next_due(conn, namespace, now=now)

        return await self._in_thread(probe)

    def outbox_waiter(self, namespace: str) -> OutboxWaiter:
        """Polling (dialects with a notification channel override it)."""
        return PollingWaiter()

    # -- result waits --------------------------------------------------------------------------

    def read_outcomes(self, namespace: str, task_ids: Sequence[str]) -> dict[str, TaskOutcome]:
        """State and outcome of each task, by id."""
        return outcomes.read_outcomes(self._read_engine, namespace, task_ids)

    def read_identity(self, namespace: str, task_id: str) -> tuple[str, int] | None:
        """The task's name and current generation."""
        return outcomes.read_identity(self._read_engine, namespace, task_id)

    # -- the worker --------------------------------------------------------------------------

    async def claim_executions(
        self,
        namespace: str,
        requests: Sequence[ClaimRequest],
        *,
        worker_id: str,
        now: datetime,
        lease: timedelta,
        hold: bool = False,
    ) -> list[ExecutionClaim | ClaimRefused]:
        """Take the execution fence for a read batch in one transaction."""
        if not requests:
            return []
        keys, traceparents = execution.claim_keys(requests)

        def claim() -> list[ExecutionClaim | ClaimRefused]:
            with self._engine.begin() as conn:
                rows = execution.claim_rows(
                    conn, namespace, keys, worker_id=worker_id, now=now, lease_until=now + lease, hold=hold
                )
                execution.open_attempts(conn, namespace, rows, traceparents, worker_id=worker_id, now=now)
                follow_ups = execution.claim_follow_ups(requests, rows)
                known = (
                    execution.after_claim(conn, namespace, follow_ups, now) if follow_ups else execution.NOTHING_KNOWN
                )
            return execution.claims_for(requests, rows, known, namespace=namespace, worker_id=worker_id, hold=hold)

        return await self._in_thread(claim)

    async def commit_results(self, writes: Sequence[FinalWrite], *, now: datetime) -> None:
        """Commit a group of results in ONE transaction, each fenced on its own: the writes
        without an on-commit hook together (one statement on PostgreSQL), each hooked one in a
        savepoint of its own, then each committed child's outcome into its parent's journal."""
        unhooked = [w for w in writes if not results.runs_hook(w)]
        hooked = [w for w in writes if results.runs_hook(w)]

        def commit() -> None:
            with self._engine.begin() as conn:
                parents = any(w.claim.parent_id is not None for w in writes)
                if hooked or (parents and not self.commit_plain_locks_parents):  # several statements
                    self._lock_with_parents(conn, [w.claim for w in writes])
                still_open = self._commit_plain(conn, unhooked, now) if unhooked else []
                for w in hooked:
                    results.commit_hooked(conn, w, now)
                for w in writes:
                    if w.outcome is results.CommitOutcome.COMMITTED:
                        w.resumed = self._settle_parent(conn, w.claim, ChildOutcome("SUCCEEDED", w.result_json), now)
                self._finish_attempts(conn, [*still_open, *hooked], now)

        await self._in_thread(commit)

    async def record_failure(
        self,
        claim: ExecutionClaim,
        *,
        now: datetime,
        error_type: str,
        error_message: str,
        retry_at: datetime | None,
        on_failed: Callable[[sa.Connection], None] | None = None,
        traceback: str | None = None,
        in_hook: bool = False,
    ) -> results.RecordedFailure | None:
        """Record a failed attempt, fenced (on the application's engine: it runs hooks)."""

        def record() -> results.RecordedFailure | None:
            with self._engine.begin() as conn:
                if retry_at is None and claim.parent_id is not None:  # a final failure settles the parent
                    self._lock_with_parents(conn, [claim])
                recorded = results.record_failure(
                    conn,
                    claim,
                    now=now,
                    error_type=error_type,
                    error_message=error_message,
                    retry_at=retry_at,
                    on_failed=on_failed,
                    traceback=traceback,
                    in_hook=in_hook,
                )
                if not recorded:
                    return None
                if retry_at is not None:
                    self._wake_dispatchers(conn, claim.namespace)
                    return results.RecordedFailure()
                outcome = ChildOutcome("FAILED", None, error_type[:200], error_message)
                return results.RecordedFailure(self._settle_parent(conn, claim, outcome, now))

        return await self._in_thread(record)

    async def renew_leases(self, claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> set[str]:
        """Extend the leases of running attempts in one statement."""
        if not claims:
            return set()
        return await self._in_thread(
            partial(self._runtime_transaction, leases.renew_leases, claims, now=now, lease=lease)
        )

    async def heartbeat(self, claim: ExecutionClaim, *, now: datetime, lease: timedelta) -> bool:
        """Extend one attempt's lease."""
        return await self._in_thread(partial(self._runtime_transaction, leases.heartbeat, claim, now=now, lease=lease))

    async def mark_solo(self, claim: ExecutionClaim, *, now: datetime) -> None:
        """Record that this attempt starts, alone."""
        await self._in_thread(partial(self._runtime_transaction, leases.mark_solo, claim, now=now))

    async def mark_started(self, claims: Sequence[ExecutionClaim], *, now: datetime) -> None:
        """Record that held attempts start now, their rows locked in id order first (as every
        multi-row write of dt_tasks: a lease renewal or a group commit beside it)."""
        await self._in_thread(partial(self._runtime_transaction, self._mark_started, claims, now))

    def _mark_started(self, conn: sa.Connection, claims: Sequence[ExecutionClaim], now: datetime) -> None:
        self._lock_tasks(conn, sorted({c.task_id for c in claims}))
        leases.mark_started(conn, claims, now=now)

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the engine's pool."""
        self.close()

    def close(self) -> None:
        """Close the engine's pool."""
        self._engine.dispose()

    # -- helpers -----------------------------------------------------------------------------

    async def _in_thread(self, call: Callable[[], R]) -> R:
        """Run ``call`` (one transaction) in a worker thread."""
        return await anyio.to_thread.run_sync(call)

    def _runtime_transaction(self, action: Callable[..., R], *args: object, **kwargs: object) -> R:
        """``action(conn, ...)`` in a transaction of the runtime's own (no application code)."""
        with self.runtime_engine.begin() as conn:
            return action(conn, *args, **kwargs)

    def _runtime_read(self, action: Callable[..., R], *args: object, **kwargs: object) -> R:
        """``action(conn, ...)`` reading on the runtime's own engine."""
        with self.runtime_engine.connect() as conn:
            return action(conn, *args, **kwargs)
