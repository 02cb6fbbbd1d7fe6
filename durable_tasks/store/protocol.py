"""The one seam between the runtime and SQL: the :class:`Store` protocol.

Loops (dispatcher, worker, reaper), the App and the CLI speak to the database only through
a Store; none of them asks which database it is. Each dialect has one implementation, chosen
once where the engine is built (:func:`durable_tasks.store.open_store`).

Three kinds of methods:

* **in the caller's transaction** (sync, a Session): ``submit``, ``rerun``, ``cancel``; the
  caller commits;
* **the App's own** (sync, as the App's API): ``create_all``, ``load_task``, ``prune``,
  ``facts``;
* **the loops'** (async): each is its own transaction, run on the event loop's own
  connections or in a worker thread, as the dialect does best.

Errors: an outage or a refused statement comes out as SQLAlchemy's ``SQLAlchemyError``
family, which the loops treat as "try again later" (an entry stays pending, a row keeps its
lease); the App turns it into :class:`~durable_tasks.errors.DatabaseUnavailableError`.

Adding an operation: a method here, its statements in each dialect's module (for PostgreSQL
a named statement in ``sql/postgres.sql``), and a test in ``tests/integration/test_store.py``,
which runs every method against every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ..journal import PendingChild, PendingSignal, RecordedStep, StepKind
from ..outcome import TaskOutcome
from ..policy import TaskLeaseView
from ..records import AttemptRecord, TaskRecord
from .deferral import Deferral
from .execution import ClaimRefused, ClaimRequest, ExecutionClaim
from .journaling import Suspension
from .notify import OutboxWaiter
from .outbox import ClaimedDelivery, Dead, Retry, Sent
from .pooler import PoolingReport
from .queries import QueueBacklog
from .recovery import DeadTask, ReconcileCursor, UnconfirmedPage
from .results import FinalWrite, RecordedFailure
from .retention import PruneReport
from .submit import NewTask, SubmitOutcome
from .waits import OpenWait

if TYPE_CHECKING:
    from ..views import StepInfo

__all__ = ["DatabaseFacts", "DatabaseProblem", "Store"]


@dataclass(frozen=True, slots=True)
class DatabaseProblem:
    """A server setting that can lose or duplicate work, and what to do about it."""

    check: str
    message: str
    severe: bool = True


@dataclass(slots=True)
class DatabaseFacts:
    """What ``durable-tasks doctor`` learns from the database."""

    #: The server's clock (None where the server has no clock of its own: SQLite).
    now: datetime | None
    #: CREATE INDEX statements for the runtime's indexes the database lacks.
    indexes_missing: list[str] = field(default_factory=list)
    #: Settings of this server that would lose or duplicate work.
    problems: list[DatabaseProblem] = field(default_factory=list)
    #: What sits between the runtime and the server (None: nothing the store can probe).
    pooling: PoolingReport | None = None
    #: Whether a test notification sent as a submit sends it reached a dispatcher's listener
    #: (None: the database has no notifications; dispatchers poll).
    listen_reaches: bool | None = None


class Store(Protocol):
    """The SQL side of the runtime for one database (see the module docstring)."""

    @property
    def engine(self) -> sa.Engine:
        """The application's engine: Sessions for submit, the transactions that run hooks."""
        ...

    @property
    def read_engine(self) -> sa.Engine:
        """The same pool for read-only work: on SQLite its transactions take no write lock, on
        PostgreSQL they plan keyed (sequential scans priced out)."""
        ...

    #: Whether the database itself wakes dispatchers at a submit's commit (PostgreSQL's
    #: NOTIFY); elsewhere the runtime publishes a wake-up on Redis (durable_tasks.wakeup).
    notifies_dispatchers: bool
    #: The share of the time a paced prune's transactions may hold the database (below 1: a
    #: prune leaves the workers the lock, on SQLite, and their CPU); a reaper's retention
    #: pass keeps to it too.
    prune_duty: float

    # -- the App's own ---------------------------------------------------------------------

    def create_all(self, tables: Sequence[sa.Table]) -> None:
        """Create ``tables`` (the runtime's and the application's) where they do not exist."""
        ...

    def load_task(self, namespace: str, task_id: str) -> tuple[TaskRecord, list[AttemptRecord]] | None:
        """The task row and its attempts (oldest first); None if there is no such task."""
        ...

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
        """Delete settled outbox rows and final tasks finished before ``before``, in batches;
        ``paced`` pauses between batches (``prune_duty``) to leave the workers their share, but
        never below ``min_rate`` tasks a second."""
        ...

    async def facts(self) -> DatabaseFacts:
        """What doctor checks: the server's clock, missing indexes, risky server settings, a
        pooler in the way, whether notifications reach a dispatcher."""
        ...

    # -- in the caller's transaction -------------------------------------------------------

    def submit(self, session: Session, task: NewTask, now: datetime) -> SubmitOutcome:
        """Write the task and its first delivery intent; a duplicate idempotency key returns
        the existing task."""
        ...

    def submit_many(self, session: Session, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """Several tasks of one name, each as :meth:`submit` writes it; outcomes in order (one
        statement where the dialect can)."""
        ...

    def rerun(
        self,
        session: Session,
        namespace: str,
        task_id: str,
        now: datetime,
        *,
        due: datetime | None = None,
        expected_generation: int | None = None,
        expected_states: Collection[str] | None = None,
    ) -> int | None:
        """Start a new generation and its first delivery (due at ``due``, default now); None
        if there is no such task, or (nothing written) if it is not at ``expected_generation``
        or not in one of ``expected_states``, each checked under the row's lock when given."""
        ...

    def cancel(self, session: Session, namespace: str, task_id: str, now: datetime) -> bool | None:
        """Cancel a task with no final write yet; None if no such task, False if already final."""
        ...

    # -- the dispatcher --------------------------------------------------------------------

    async def lease_outbox(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> list[ClaimedDelivery]:
        """Lease up to ``limit`` due PENDING outbox rows, oldest first (rows another
        dispatcher holds are skipped), with what publishing needs."""
        ...

    async def lease_outbox_and_next_due(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> tuple[list[ClaimedDelivery], datetime | None]:
        """:meth:`lease_outbox` and :meth:`next_due` at ``now`` together: what a dispatcher
        that will wait after this pass needs, in one round trip where the store can."""
        ...

    async def read_payload(self, task_id: str) -> str | None:
        """The task's payload JSON (None: no such task), for a leased row or a claim that
        carried none (over ``INLINE_PAYLOAD_BYTES``)."""
        ...

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
        """Record one dispatch pass's outcomes, each row fenced by its claim token; returns the
        rows marked SENT."""
        ...

    async def next_due(self, namespace: str, *, now: datetime) -> datetime | None:
        """When the earliest PENDING outbox row not due at ``now`` will be (None: none waits):
        the dispatcher sleeps until then."""
        ...

    def outbox_waiter(self, namespace: str) -> OutboxWaiter:
        """How a dispatcher waits for new outbox rows between passes."""
        ...

    # -- the worker ------------------------------------------------------------------------

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
        """Take the execution fence for a read batch (answers in request order). The attempts of
        suspects (``reclaims > 0``), and every attempt with ``hold`` (the worker isolates), are
        claimed held: not started until :meth:`mark_started` or :meth:`mark_solo`."""
        ...

    async def commit_results(self, writes: Sequence[FinalWrite], *, now: datetime) -> None:
        """Commit a group of results in one transaction, each fenced on its own; sets each
        write's ``outcome``."""
        ...

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
    ) -> RecordedFailure | None:
        """Record a failed attempt, fenced: RETRYING with a new delivery due at ``retry_at``,
        or FAILED (running ``on_failed`` in the same transaction, and settling a child's slot
        in its parent, whose resume it returns); None when fenced out. The attempt keeps
        ``traceback``, and says ``hook_failed`` when the on_commit hook raised."""
        ...

    async def renew_leases(self, claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> set[str]:
        """Extend the leases of running attempts; returns the task ids still held."""
        ...

    async def heartbeat(self, claim: ExecutionClaim, *, now: datetime, lease: timedelta) -> bool:
        """Extend one attempt's lease; False once it is fenced out."""
        ...

    async def mark_solo(self, claim: ExecutionClaim, *, now: datetime) -> None:
        """Record that this attempt starts, alone (if its worker dies now, the loss is its own)."""
        ...

    async def mark_started(self, claims: Sequence[ExecutionClaim], *, now: datetime) -> None:
        """Record that held attempts (:attr:`ExecutionClaim.held`) start now (a loss of their
        worker from here on makes them more suspect), in one statement."""
        ...

    # -- result waits ----------------------------------------------------------------------

    def read_outcomes(self, namespace: str, task_ids: Sequence[str]) -> dict[str, TaskOutcome]:
        """State and outcome of each task, by id (absent: no such task), in one statement per
        few hundred ids."""
        ...

    def read_identity(self, namespace: str, task_id: str) -> tuple[str, int] | None:
        """The task's name and current generation; None if there is no such task."""
        ...

    # -- the reaper ------------------------------------------------------------------------

    async def lease_views(self, namespace: str, task_ids: Iterable[str]) -> dict[str, TaskLeaseView]:
        """What the database says about each task (absent ids: no such task)."""
        ...

    async def redeliver(
        self,
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
        """Supersede a delivery nobody holds with a new one (delivery + 1), due at ``due``
        (default now); False if stale (superseded, finished, suspended, or held by a live lease,
        judged under the row's lock)."""
        ...

    async def redeliver_lost(
        self,
        namespace: str,
        lost: Sequence[tuple[str, int, int]],
        *,
        now: datetime,
        reason: str,
        count_reclaim: bool = True,
    ) -> list[bool]:
        """Supersede the lost deliveries ``(task_id, generation, delivery)`` (a dead worker's, or
        entries Redis lost: ``count_reclaim`` False), each as :meth:`redeliver`, in one
        transaction; one flag per item (False: stale)."""
        ...

    async def defer_deliveries(self, namespace: str, rows: Sequence[Deferral], *, now: datetime) -> int:
        """Flow control: supersede deliveries refused admission with new ones due later (no
        attempt counted); returns how many moved (:mod:`.deferral`)."""
        ...

    async def dead_letter_task(
        self,
        namespace: str,
        *,
        task_id: str,
        generation: int,
        delivery: int,
        now: datetime,
        reason: str,
        on_dead: Callable[[sa.Connection, DeadTask], None] | None = None,
    ) -> bool:
        """Mark the task DEAD (running ``on_dead`` in the same transaction); False if it moved
        on meanwhile, suspended, or its lease is live again."""
        ...

    async def unconfirmed_deliveries(
        self,
        namespace: str,
        *,
        now: datetime,
        grace: timedelta,
        limit: int,
        after: ReconcileCursor | None = None,
    ) -> UnconfirmedPage:
        """Up to ``limit`` tasks sent longer than ``grace`` ago, or running on an expired lease,
        after ``after`` in (enqueued_at, id) order, with the entry id of their current delivery
        (the reconciler checks Redis still has it), and where the next page starts."""
        ...

    async def queue_backlogs(self, namespace: str) -> dict[str, QueueBacklog]:
        """Pending outbox rows (count, oldest) and the oldest undelivered task, per queue."""
        ...

    # -- the step journal (``durable_tasks.journal``) -------------------------------------------

    async def load_steps(self, task_id: str, generation: int) -> list[RecordedStep]:
        """Every journal row of the task's generation."""
        ...

    async def record_step(
        self, claim: ExecutionClaim, slot: str, label: str, result_json: str, *, now: datetime, lease: timedelta
    ) -> str | None:
        """Record a step under the attempt's fence; the recorded result, or None when fenced out."""
        ...

    async def suspend(
        self,
        claim: ExecutionClaim,
        children: Sequence[tuple[PendingChild, NewTask]],
        signals: Sequence[PendingSignal],
        *,
        now: datetime,
    ) -> Suspension | None:
        """Submit the children, open the waits, move the task to WAITING (or redeliver it when
        nothing is left to wait for), in one fenced transaction; how it ended and the children
        it created, or None when fenced out."""
        ...

    def deliver_signal(self, namespace: str, task_id: str, name: str, payload_json: str, now: datetime) -> bool | None:
        """Deliver a signal to the task's current generation; None: no such task; False: delivered before."""
        ...

    def open_waits(self, namespace: str, *, kinds: Sequence[StepKind], limit: int, after_id: int) -> list[OpenWait]:
        """Open waits of these kinds, oldest first, ``limit`` after ``after_id``."""
        ...

    def list_steps(self, namespace: str, task_id: str) -> list[StepInfo] | None:
        """The journal of the task's current generation; None when there is no such task."""
        ...

    # -- lifecycle -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the loops' connections and the engine's pool."""
        ...

    def close(self) -> None:
        """The same from sync code (a finished event loop's connections are closed at once)."""
        ...
