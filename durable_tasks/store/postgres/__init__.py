"""The store on PostgreSQL.

The hot paths (submit; the dispatcher's lease and mark-SENT; the worker's batch claim, group
commit and lease renewal) are named statements from ``sql/postgres.sql`` (:mod:`.statements`,
the submits' :mod:`.submits`): one fixed text per batch, values in binary arrays, each its own
transaction, sent on the event loop's own connections (:mod:`.connections`). The rare paths (a
pass with dead or held rows, a group with on-commit hooks, a claim's follow-ups) and everything
else run the shared Core statements of :class:`~..base.SqlStore` in a worker thread.

Every multi-row write of ``dt_tasks`` locks its rows in ascending id order, so that two of them
never lock the same rows in opposite orders and deadlock: the named statements in their first
CTE, a multi-statement group up front (:meth:`PostgresStore._lock_tasks`). The lease and the
mark-SENT commit without waiting for the WAL flush: losing one to a crash only means a
deduplicated republish. Submits NOTIFY the dispatchers on commit (:mod:`.notify`). The
planner setting of the runtime's statements lives in :mod:`.planner`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy.orm import Session

from ...journal import PendingChild, PendingSignal, Suspended
from ...journal_records import ChildOutcome
from ...loopbound import LoopBound
from ...records import tasks_table
from ...settings import Settings
from .. import execution, journal, recovery, results
from ..base import SqlStore
from ..engine import ping_when_idle
from ..execution import ClaimRefused, ClaimRequest, ExecutionClaim
from ..ids import new_task_id
from ..notify import OutboxWaiter
from ..outbox import ClaimedDelivery, Dead, NewDelivery, Retry, Sent
from ..pooler import PathProbe, conninfo, detect_pooling, listen_reaches, prepare_as_decided, split_prepare_threshold
from ..protocol import DatabaseFacts
from ..results import FinalWrite
from ..submit import NewTask, SubmitOutcome, find_by_key
from . import planner, statements, submits
from .connections import AsyncConnections
from .notify import LISTEN_CHECK, PostgresNotifyWaiter

__all__ = ["PostgresStore"]

t = tasks_table.c


async def _aclose(connections: AsyncConnections) -> None:
    connections.close()


class PostgresStore(SqlStore):
    """:class:`~..protocol.Store` on PostgreSQL (psycopg 3)."""

    notifies_dispatchers = True
    insert_ignores_taken_keys = True  # submit_task: ON CONFLICT DO NOTHING
    keeps_payloads_aside = False  # TOAST keeps a long payload apart already (store/payloads.py)

    def __init__(
        self,
        engine: sa.Engine,
        *,
        listen_url: str | None = None,
        listen_check: timedelta = LISTEN_CHECK,
        probe: PathProbe | None = None,
    ) -> None:
        super().__init__(engine)
        self._listen_url = sa.make_url(listen_url) if listen_url else engine.url
        self._listen_check = listen_check
        self.probe = probe or PathProbe(conninfo(engine.url))
        planner.plan_runtime_transactions(engine)
        self._runtime_engine = planner.runtime_plans(engine)
        self._connections: LoopBound[AsyncConnections] = LoopBound(
            lambda: AsyncConnections(engine, probe=self.probe), close_stale=AsyncConnections.close, aclose=_aclose
        )

    @classmethod
    def open(cls, url: sa.URL, settings: Settings | None = None) -> PostgresStore:
        """A store on the database at ``url`` (``postgresql://`` means psycopg 3); dispatchers
        LISTEN on ``settings.listen_database_url`` when it is set (a direct connection behind
        a transaction pooler). psycopg prepares statements as ``settings.prepare_threshold``
        says, or the URL's ``?prepare_threshold=`` when that is ``auto``, and never behind a
        pooler in transaction mode (:func:`..pooler.decide_prepare_threshold`)."""
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        url, in_url = split_prepare_threshold(url)
        engine = sa.create_engine(url, pool_size=10, max_overflow=20)
        ping_when_idle(engine)
        probe = PathProbe(conninfo(engine.url))
        asked = settings.prepare_threshold if settings is not None else "auto"
        prepare_as_decided(engine, in_url if asked == "auto" else asked, probe)
        if settings is None:
            return cls(engine, probe=probe)
        return cls(
            engine, listen_url=settings.listen_database_url, listen_check=settings.listen_check_timeout, probe=probe
        )

    @property
    def runtime_engine(self) -> sa.Engine:
        """The pool, planning with sequential scans priced out (:mod:`.planner`)."""
        return self._runtime_engine

    @property
    def read_engine(self) -> sa.Engine:
        """Read-only work plans keyed too: the runtime's and the operators' reads (stats, task
        views, the dashboard) find their rows by key or index."""
        return self._runtime_engine

    @property
    def connections(self) -> AsyncConnections:
        """The running event loop's own connections."""
        return self._connections.get()

    # -- what PostgreSQL does differently ---------------------------------------------------

    def _insert_task(self, conn: sa.Connection, task: NewTask, task_id: str, now: datetime, *, aside: bool) -> bool:
        return submits.submit_task(task, task_id, now).run_on(conn)  # never aside: keeps_payloads_aside

    def submit_many(self, session: Session, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """A batch is ONE statement (postgres.sql: submit_tasks): one round trip."""
        if len(tasks) < 2:
            return super().submit_many(session, tasks, now)
        conn = session.connection()
        return _outcomes(conn, tasks, submits.submit_tasks(tasks, [new_task_id() for _ in tasks], now).run_on(conn))

    def _submit_children(self, conn: sa.Connection, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """A suspension's children are ONE statement (postgres.sql: submit_children)."""
        if len(tasks) < 2:
            return super()._submit_children(conn, tasks, now)
        return _outcomes(conn, tasks, submits.submit_children(tasks, [new_task_id() for _ in tasks], now).run_on(conn))

    def _suspend_conn(
        self,
        conn: sa.Connection,
        claim: ExecutionClaim,
        children: Sequence[tuple[PendingChild, NewTask]],
        signals: Sequence[PendingSignal],
        *,
        now: datetime,
        created: list[tuple[NewTask, SubmitOutcome]],
    ) -> Suspended | None:
        """A suspension on children alone is ONE statement (postgres.sql: suspend_on_children);
        one with signals takes the general path (a signal's slot may hold its delivery)."""
        if signals or not children:
            return super()._suspend_conn(conn, claim, children, signals, now=now, created=created)
        ids = [new_task_id() for _ in children]
        rows = submits.suspend_on_children(claim, children, ids, now).run_on(conn)
        if not rows:
            return None  # fenced out: nothing was written
        found: dict[str, str] = {}  # slot -> the child found rather than created
        for (child, task), (task_id, was_created, generation, _) in zip(children, rows, strict=True):
            if task_id is None:  # pragma: no cover - a key taken meanwhile: the fence serializes suspensions
                raise RuntimeError("a suspension's child key is held by a task it cannot see")
            if was_created:
                created.append((task, SubmitOutcome(task_id, int(generation), created=True)))
            else:
                found[child.slot] = task_id
        opened = len(found) < len(children)  # a child created now has a new, open wait
        return journal.finish_suspension(conn, claim, found, waits_opened=opened, now=now, resume=self._resume_if_ready)

    def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None:
        # Delivered when the transaction commits; a rollback sends nothing.
        conn.execute(sa.select(sa.func.pg_notify(statements.NOTIFY_CHANNEL, namespace)))

    def _resume_if_ready(
        self, conn: sa.Connection, namespace: str, task_id: str, generation: int, now: datetime
    ) -> NewDelivery | None:
        return statements.resume_if_ready(namespace, task_id, generation, now).run_on(conn)

    def _wait_fenced(self, conn: sa.Connection, claim: ExecutionClaim, now: datetime) -> bool:
        return statements.wait_fenced(claim, now).run_on(conn)

    def _record_step(
        self,
        conn: sa.Connection,
        claim: ExecutionClaim,
        slot: str,
        label: str,
        result_json: str,
        *,
        now: datetime,
        lease: timedelta,
    ) -> str | None:
        record = statements.record_step(claim, slot, label, result_json, now=now, lease=lease).run_on(conn)
        if not record.owned:
            return None
        if record.inserted:
            return result_json
        if record.existing is not None:
            return record.existing
        return journal.recorded_result(conn, claim, slot)  # committed after the statement's snapshot

    def _settle_slot(
        self,
        conn: sa.Connection,
        namespace: str,
        parent_id: str,
        parent_generation: int,
        slot: str,
        outcome: ChildOutcome,
        now: datetime,
    ) -> NewDelivery | None:
        settle = (slot, outcome)
        return statements.resume_if_ready(namespace, parent_id, parent_generation, now, settle=settle).run_on(conn)

    def _lock_tasks(self, conn: sa.Connection, task_ids: Sequence[str]) -> None:
        if task_ids:
            conn.execute(sa.select(t.id).where(t.id.in_(task_ids)).order_by(t.id).with_for_update()).all()

    def _redeliver_lost(
        self,
        conn: sa.Connection,
        namespace: str,
        lost: Sequence[tuple[str, int, int]],
        *,
        now: datetime,
        reason: str,
        count_reclaim: bool,
    ) -> list[bool]:
        if not lost:
            return []
        statement = statements.redeliver_lost(namespace, lost, now=now, reason=reason, count_reclaim=count_reclaim)
        return recovery.first_of(lost, statement.run_on(conn))

    def _mark_sent(self, conn: sa.Connection, sent: Sequence[Sent], now: datetime) -> int:
        if not sent:  # the mark_sent statement turns the WAL-flush wait off itself
            conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            return 0
        return statements.mark_sent(sent, now).run_on(conn)

    commit_plain_locks_parents = True

    def _commit_plain(self, conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> list[FinalWrite]:
        parent_ids = sorted({w.claim.parent_id for w in writes if w.claim.parent_id is not None})
        statements.commit_results(writes, now, parent_ids=parent_ids).run_on(conn)
        return []  # the statement closed their attempts too

    def _finish_attempts(self, conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> None:
        closed = results.closed_attempts(writes)
        if closed:
            statements.finish_attempts(closed, now).run_on(conn)

    def _server_now(self, conn: sa.Connection) -> datetime | None:
        now: datetime = conn.execute(sa.select(sa.func.now())).scalar_one()
        return now

    def outbox_waiter(self, namespace: str) -> OutboxWaiter:
        """LISTEN for the submits' NOTIFY; polling when the listening connection fails, or when
        a NOTIFY does not reach it (a transaction pooler)."""
        return PostgresNotifyWaiter(
            self._listen_url, namespace, notify_url=self.engine.url, check_timeout=self._listen_check
        )

    async def facts(self) -> DatabaseFacts:
        """The shared facts, plus what sits between the runtime and PostgreSQL and whether a
        test NOTIFY sent through the application's URL reaches a LISTEN on the listener's."""
        facts = await super().facts()
        dsn, listen_dsn = conninfo(self.engine.url), conninfo(self._listen_url)
        facts.pooling = await to_thread.run_sync(detect_pooling, dsn)
        timeout = self._listen_check.total_seconds()
        facts.listen_reaches = await listen_reaches(listen_dsn, dsn, statements.NOTIFY_CHANNEL, timeout=timeout)
        return facts

    # -- the hot paths, on the event loop's own connections ---------------------------------

    async def lease_outbox(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> list[ClaimedDelivery]:
        """One statement: lease the rows and read their tasks."""
        rows, _ = await self.lease_outbox_and_next_due(
            namespace, now=now, lease=lease, limit=limit, watermark=watermark
        )
        return rows

    async def lease_outbox_and_next_due(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> tuple[list[ClaimedDelivery], datetime | None]:
        """The same statement: it reads the next due time too."""
        return await self.connections.run(
            statements.claim_outbox(namespace, now=now, lease=lease, limit=limit, watermark=watermark)
        )

    async def next_due(self, namespace: str, *, now: datetime) -> datetime | None:
        """One probe of ix_dt_outbox_pending_due, on the event loop's own connection."""
        return await self.connections.run(statements.next_due(namespace, now))

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
        """The usual pass (every row published) is one statement; others a transaction."""
        if sent and not dead and not retry and not held:
            return await self.connections.run(statements.mark_sent(sent, now))
        return await super().settle_outbox(sent=sent, dead=dead, retry=retry, held=held, now=now, release_at=release_at)

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
        """One statement claims, opens the attempts and does a re-run's follow-up (the earlier
        attempt's trace context; attempts left open closed as lost); ids not claimed, which
        are rare, are looked up after it in a transaction of their own."""
        if not requests:
            return []
        rows, previous = await self.connections.run(
            statements.claim_executions(namespace, requests, worker_id=worker_id, now=now, lease=lease, hold=hold)
        )
        known = execution.Known(previous, frozenset()) if previous else execution.NOTHING_KNOWN
        if missing := {r.task_id for r in requests} - {r.id for r in rows}:
            follow_ups = execution.FollowUps([], missing)

            def after() -> execution.Known:
                with self.engine.begin() as conn:
                    return execution.after_claim(conn, namespace, follow_ups, now)

            known = execution.Known(previous, (await self._in_thread(after)).existing)
        return execution.claims_for(requests, rows, known, namespace=namespace, worker_id=worker_id, hold=hold)

    async def commit_results(self, writes: Sequence[FinalWrite], *, now: datetime) -> None:
        """A group without on-commit hooks is one statement; with hooks, a transaction with a
        savepoint per hooked result."""
        if writes and all(results.plain(w) for w in writes):
            await self.connections.run(statements.commit_results(writes, now))
            return
        await super().commit_results(writes, now=now)

    async def renew_leases(self, claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> set[str]:
        """One statement."""
        if not claims:
            return set()
        return await self.connections.run(statements.renew_leases(claims, now=now, lease=lease))

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the loops' connections and the pool."""
        await self._connections.aclose()
        self.engine.dispose()

    def close(self) -> None:
        """The same without waiting on any loop."""
        self._connections.close()
        self.engine.dispose()


def _outcomes(conn: sa.Connection, tasks: Sequence[NewTask], rows: statements.Rows) -> list[SubmitOutcome]:
    """A batch submit's rows (task id or NULL, created, generation), in the tasks' order. A key
    that another transaction committed after the statement began comes back NULL and is read
    again (ON CONFLICT waited for that commit)."""
    found: list[SubmitOutcome] = []
    for task, (task_id, created, generation, _) in zip(tasks, rows, strict=True):
        if task_id is not None:
            found.append(SubmitOutcome(task_id, int(generation), created=bool(created)))
            continue
        existing = find_by_key(conn, task)
        if existing is None:  # pragma: no cover - the conflicting row must be visible now
            raise RuntimeError("idempotency conflict without a visible task")
        found.append(existing)
    return found
