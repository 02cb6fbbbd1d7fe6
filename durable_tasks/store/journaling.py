"""The store's journal operations (``dt_steps``), shared by every dialect: a mixin of
:class:`~.base.SqlStore` that runs :mod:`.journal`'s statements in its transactions with the
dialect's row lock and dispatcher wake-up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import anyio
import sqlalchemy as sa

from ..journal import ChildOutcome, PendingChild, PendingSignal, RecordedStep, StepKind, Suspended
from ..records import TERMINAL_STATES, steps_table, tasks_table
from . import journal, waits
from .execution import ExecutionClaim
from .outbox import Dead, NewDelivery, Sent
from .submit import NewTask, SubmitOutcome
from .waits import OpenWait

if TYPE_CHECKING:
    from ..views import StepInfo

__all__ = ["JournalStore", "Suspension"]

s = steps_table.c
t = tasks_table.c


@dataclass(frozen=True, slots=True)
class Suspension:
    """A committed suspension: how it ended, and the children it created (a child of an
    earlier, retried suspension is found, not created), each with the task it resolved to."""

    state: Suspended
    created: tuple[tuple[NewTask, SubmitOutcome], ...] = ()


class JournalStore:
    """Journal operations; the concrete store supplies the engine and the dialect's hooks."""

    _engine: sa.Engine
    _read_engine: sa.Engine

    def _lock_tasks(self, conn: sa.Connection, task_ids: Sequence[str]) -> None:  # pragma: no cover - dialects
        raise NotImplementedError

    #: Whether the database wakes dispatchers itself when an outbox row commits (PostgreSQL).
    notifies_dispatchers: bool

    def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None:  # pragma: no cover - dialects
        raise NotImplementedError

    def _submit_children(  # pragma: no cover - SubmitStore's
        self, conn: sa.Connection, tasks: Sequence[NewTask], now: datetime
    ) -> list[SubmitOutcome]:
        raise NotImplementedError

    # -- an attempt's journal (the worker) ---------------------------------------------------

    async def load_steps(self, task_id: str, generation: int) -> list[RecordedStep]:
        """Every journal row of the task's generation."""

        def read() -> list[RecordedStep]:
            with self._engine.connect() as conn:
                return journal.load_steps(conn, task_id, generation)

        return await anyio.to_thread.run_sync(read)

    async def record_step(
        self, claim: ExecutionClaim, slot: str, label: str, result_json: str, *, now: datetime, lease: timedelta
    ) -> str | None:
        """Record a step under the attempt's fence (extending its lease); the recorded result,
        or None when fenced out."""

        def write() -> str | None:
            with self._engine.begin() as conn:
                return self._record_step(conn, claim, slot, label, result_json, now=now, lease=lease)

        return await anyio.to_thread.run_sync(write)

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
        """:func:`.journal.record_step` as the dialect runs it (PostgreSQL's store: one statement)."""
        return journal.record_step(conn, claim, slot, label, result_json, now=now, lease=lease)

    async def suspend(
        self,
        claim: ExecutionClaim,
        children: Sequence[tuple[PendingChild, NewTask]],
        signals: Sequence[PendingSignal],
        *,
        now: datetime,
    ) -> Suspension | None:
        """Submit the children, open the waits, WAITING (or redelivered): one fenced transaction."""

        def write() -> Suspension | None:
            created: list[tuple[NewTask, SubmitOutcome]] = []
            with self._engine.begin() as conn:
                suspended = self._suspend_conn(conn, claim, children, signals, now=now, created=created)
                if suspended is None:
                    return None
                if children and not self.notifies_dispatchers:
                    self._wake_dispatchers(conn, claim.namespace)  # the children's outbox rows
            return Suspension(suspended, tuple(created))

        return await anyio.to_thread.run_sync(write)

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
        """:func:`.journal.suspend` in ``conn``'s transaction, the children it creates appended
        to ``created`` (PostgreSQL's store: a suspension on children alone is one statement)."""

        def submit_children(conn: sa.Connection, tasks: Sequence[NewTask], at: datetime) -> list[SubmitOutcome]:
            outcomes = self._submit_children(conn, tasks, at)
            created.extend((task, found) for task, found in zip(tasks, outcomes, strict=True) if found.created)
            return outcomes

        return journal.suspend(
            conn,
            claim,
            children,
            signals,
            now=now,
            submit_children=submit_children,
            wait=self._wait_fenced,
            resume=self._resume_if_ready,
        )

    def _wait_fenced(self, conn: sa.Connection, claim: ExecutionClaim, now: datetime) -> bool:
        """:func:`.journal.wait_fenced` as the dialect runs it (PostgreSQL's store: one statement)."""
        return journal.wait_fenced(conn, claim, now)

    def _resume_if_ready(
        self, conn: sa.Connection, namespace: str, task_id: str, generation: int, now: datetime
    ) -> NewDelivery | None:
        """:func:`.journal.resume_if_ready` with the dialect's wake-up (PostgreSQL's store: one statement)."""
        return journal.resume_if_ready(conn, namespace, task_id, generation, now, wake=self._wake_dispatchers)

    # -- a task's end, as its parent sees it ----------------------------------------------------

    def _lock_with_parents(self, conn: sa.Connection, claims: Sequence[ExecutionClaim]) -> None:
        """First in a transaction that ends these executions' tasks and settles their parents:
        the tasks' rows and their parents', in one pass, in id order. Every transaction that
        locks several task rows takes them in id order (a claim, a group commit, the
        dispatcher's mark), so none waits on another in a cycle. A child's row locked by its
        final write and its parent's by a later statement deadlocked with a dispatcher that
        marked the parent's resume and a later child of it in one pass."""
        ids = {c.task_id for c in claims} | {c.parent_id for c in claims if c.parent_id is not None}
        self._lock_tasks(conn, sorted(ids))

    def _settle_parent(
        self, conn: sa.Connection, claim: ExecutionClaim, outcome: ChildOutcome, now: datetime
    ) -> NewDelivery | None:
        """In a child's final transaction, which locked the parent's row first
        (:meth:`_lock_with_parents`): record its outcome in the parent's journal; the parent's
        new delivery when this resumed it."""
        if claim.parent_id is None or claim.parent_generation is None or claim.parent_slot is None:
            return None
        return self._settle_slot(
            conn, claim.namespace, claim.parent_id, claim.parent_generation, claim.parent_slot, outcome, now
        )

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
        """:func:`.journal.settle_child` with the dialect's resume (PostgreSQL's store: one statement)."""
        return journal.settle_child(
            conn,
            namespace,
            parent_id=parent_id,
            parent_generation=parent_generation,
            slot=slot,
            outcome=outcome,
            now=now,
            resume=self._resume_if_ready,
        )

    def _lock_with_parent_of(self, conn: sa.Connection, task_id: str) -> bool:
        """:meth:`_lock_with_parents` for a task known by its id alone, first in a transaction
        that may end it (a cancel, a dead-letter): its row and its parent's, if it has one.
        Whether it has one: only a child's end has a slot to settle (:meth:`_settle_if_child`)."""
        parent_id = conn.execute(sa.select(t.parent_id).where(t.id == task_id)).scalar()
        if parent_id is None:
            return False
        self._lock_tasks(conn, sorted({task_id, parent_id}))
        return True

    def _settle_if_child(self, conn: sa.Connection, namespace: str, task_id: str, state: str, now: datetime) -> None:
        """After :meth:`_lock_with_parent_of` found a parent, and the task's end without a result."""
        journal.settle_if_child(conn, namespace, task_id, state, now, settle=self._settle_slot)

    def _lock_children_to_dead_letter(
        self, conn: sa.Connection, sent: Sequence[Sent], dead: Sequence[Dead]
    ) -> list[tuple[str, str]]:
        """First in a dispatcher's pass that dead-letters rows (a payload its task refuses, a
        name still unknown past its grace) when some of them are children: the pass's task rows
        and their parents', in id order (as :meth:`_lock_with_parents`). Returns (namespace,
        task id) of the children the pass is about to end, whose parents' slots it settles
        (:meth:`_settle_if_child`) once they are DEAD: a parent waits for its children's ends,
        this one included."""
        if not dead:
            return []
        generations = {row.task_id: row.generation for row, _ in dead}
        ending = sa.select(t.id, t.namespace, t.generation, t.state, t.parent_id).where(
            t.id.in_(list(generations)), t.parent_id.is_not(None)
        )
        parents = {row.parent_id for row in conn.execute(ending)}
        if not parents:
            return []
        self._lock_tasks(conn, sorted(parents | set(generations) | {row.task_id for row, _, _ in sent}))
        return [  # read again under the locks: what mark_dead will end
            (row.namespace, row.id)
            for row in conn.execute(ending)
            if row.generation == generations[row.id] and row.state not in TERMINAL_STATES
        ]

    # -- signals and reading (the App) ---------------------------------------------------------

    def deliver_signal(self, namespace: str, task_id: str, name: str, payload_json: str, now: datetime) -> bool | None:
        """Deliver a signal to the task's current generation (its own transaction)."""
        with self._engine.begin() as conn:
            return waits.deliver_signal(
                conn,
                namespace,
                task_id,
                name,
                payload_json,
                now=now,
                lock=self._lock_tasks,
                resume=self._resume_if_ready,
            )

    def open_waits(self, namespace: str, *, kinds: Sequence[StepKind], limit: int, after_id: int) -> list[OpenWait]:
        """Open waits of these kinds, oldest first, a page at a time."""
        with self._read_engine.connect() as conn:
            return waits.open_waits(conn, namespace, kinds=kinds, limit=limit, after_id=after_id)

    def list_steps(self, namespace: str, task_id: str) -> list[StepInfo] | None:
        """The journal of the task's current generation in slot order of creation; None if no such task."""
        from ..views import StepInfo

        with self._read_engine.connect() as conn:
            task = conn.execute(sa.select(t.generation).where(t.id == task_id, t.namespace == namespace)).first()
            if task is None:
                return None
            rows = conn.execute(
                sa.select(steps_table).where(s.task_id == task_id, s.generation == task.generation).order_by(s.id)
            ).all()
        return [
            StepInfo(
                slot=r.slot,
                kind=r.kind,
                label=r.label,
                done=bool(r.done),
                result=r.result,
                child_task_id=r.child_task_id,
                child_state=r.child_state,
                error=f"{r.error_type}: {r.error_message}" if r.error_type else r.error_message,
                created_at=r.created_at,
                finished_at=r.finished_at,
            )
            for r in rows
        ]
