"""The store's writes in the caller's transaction (submit, rerun, cancel), shared by every
dialect: a mixin of :class:`~.base.SqlStore` that runs :mod:`.submit`'s statements on the
session's connection with the dialect's insert, dispatcher wake-up and row locks.

A submit with an idempotency key is the common case for a judge (the submission's id) and for
every child of a suspension (``task:generation:slot``), and a new key is the common case among
those. Where the dialect's insert of a taken key changes nothing (``ON CONFLICT DO NOTHING``:
PostgreSQL, SQLite), the key is looked up only after an insert that found it taken: a new
task costs one statement on PostgreSQL (its row, its outbox row and the wake-up), a duplicate
two. MySQL's insert of a taken key updates (locks) the row that holds it, so its store looks
the key up first and inserts only a new one.

A batch (``submit_many``, a suspension's children) costs a few statements whatever its size:
one on PostgreSQL (its store's own); elsewhere one insert of the tasks, one read back of
their keys (MySQL: and one look before the insert), one insert of their outbox rows
(docs/performance.md, "Batch submits").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ..records import tasks_table
from . import journal, submit
from .ids import new_task_id
from .payloads import ASIDE_PAYLOAD_BYTES, AsideGate, insert_payloads
from .submit import NewTask, SubmitOutcome

__all__ = ["SubmitStore"]


class SubmitStore:
    """submit, rerun and cancel; the concrete store supplies the dialect's hooks."""

    #: Whether :meth:`_insert_task` of a taken idempotency key writes and locks nothing, so a
    #: key need not be looked up before the insert (see the module's docstring).
    insert_ignores_taken_keys = False
    #: Whether payloads over ``ASIDE_PAYLOAD_BYTES`` go to ``dt_payloads`` (:mod:`.payloads`):
    #: None where the task row keeps every payload (PostgreSQL), else the schema's say.
    aside_gate: AsideGate | None = None

    if TYPE_CHECKING:  # the concrete store's (defined there, not stubbed here: the MRO would pick a stub)

        def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None: ...

        def _settle_if_child(
            self, conn: sa.Connection, namespace: str, task_id: str, state: str, now: datetime
        ) -> None: ...

        def _lock_tasks(self, conn: sa.Connection, task_ids: Sequence[str]) -> None: ...

    def _insert_task(self, conn: sa.Connection, task: NewTask, task_id: str, now: datetime, *, aside: bool) -> bool:
        """Insert the task row (its payload ``''`` when ``aside``) and its first outbox row,
        waking dispatchers; False (nothing written) when the idempotency key is taken."""
        raise NotImplementedError

    def _aside(self, task: NewTask) -> bool:
        """Whether ``task``'s payload is written to ``dt_payloads`` (:mod:`.payloads`)."""
        gate = self.aside_gate
        return gate is not None and task.payload_bytes > ASIDE_PAYLOAD_BYTES and gate.open()

    def submit(self, session: Session, task: NewTask, now: datetime) -> SubmitOutcome:
        """Insert the task and its first outbox row in the session's transaction (no commit).

        A duplicate ``(namespace, name, idempotency_key)`` returns the existing task: found in
        the same transaction, committed long ago, or inserted concurrently (the insert waits for
        the other transaction, then yields to it).
        """
        return self._submit_conn(session.connection(), task, now)

    def _submit_conn(self, conn: sa.Connection, task: NewTask, now: datetime) -> SubmitOutcome:
        if task.idempotency_key is not None and not self.insert_ignores_taken_keys:
            existing = submit.find_by_key(conn, task)
            if existing is not None:
                return existing
        task_id = new_task_id()
        aside = self._aside(task)
        if self._insert_task(conn, task, task_id, now, aside=aside):
            if aside:
                insert_payloads(conn, [(task_id, task.payload_json)])
            return SubmitOutcome(task_id, 0, created=True)
        existing = submit.find_by_key(conn, task)  # the key is taken (by a concurrent submit, or before)
        if existing is None:  # pragma: no cover - the conflicting row must be visible now
            raise RuntimeError("idempotency conflict without a visible task")
        return existing

    def _insert_tasks(self, conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert task rows in as few statements as the driver batches; a row whose idempotency
        key is taken writes nothing (and changes nothing)."""
        raise NotImplementedError

    def submit_many(self, session: Session, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """Each task as :meth:`submit` writes it, in order, in a few statements whatever their
        number (:meth:`_submit_batch`)."""
        if len(tasks) < 2:
            return [self.submit(session, task, now) for task in tasks]
        return self._submit_batch(session.connection(), tasks, now)

    def _submit_children(self, conn: sa.Connection, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """A suspension's children (:func:`.journal.child_task`), each as :meth:`submit` writes
        it, in order, in the suspension's transaction."""
        if len(tasks) < 2:
            return [self._submit_conn(conn, task, now) for task in tasks]
        return self._submit_batch(conn, tasks, now)

    def _submit_batch(self, conn: sa.Connection, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """Several tasks (of one namespace) as :meth:`submit` writes each, in order: the keys
        already taken looked up first where the dialect's insert of a taken key would lock its
        row (:attr:`insert_ignores_taken_keys`), the rest in one insert, their keys read back
        (a key taken meanwhile, or twice in the batch, names the task that holds it), and the
        first outbox rows of those created in one insert. A lookup is a statement per task name
        and 500 keys, whatever the batch's size."""
        found: dict[int, SubmitOutcome] = {}
        if not self.insert_ignores_taken_keys:
            held = submit.find_by_keys(conn, tasks)
            found = {i: held[key] for i, key in _keys(tasks) if key in held}
        fresh = {i: new_task_id() for i in range(len(tasks)) if i not in found}
        aside = {i for i in fresh if self._aside(tasks[i])}
        self._insert_tasks(
            conn, [submit.task_row(tasks[i], task_id, now, aside=i in aside) for i, task_id in fresh.items()]
        )
        holders = submit.find_by_keys(conn, [tasks[i] for i in fresh])
        outcomes: list[SubmitOutcome] = []
        created: list[tuple[NewTask, str]] = []
        kept_aside: list[tuple[str, str]] = []
        for i, task in enumerate(tasks):
            if i in found:
                outcomes.append(found[i])
                continue
            task_id, key = fresh[i], task.idempotency_key
            holder = None if key is None else _holder(conn, task, key, holders)
            if holder is None or holder.task_id == task_id:
                outcomes.append(SubmitOutcome(task_id, 0, created=True))
                created.append((task, task_id))
                if i in aside:
                    kept_aside.append((task_id, task.payload_json))
            else:
                outcomes.append(holder)
        submit.insert_first_outboxes(conn, created, now)
        insert_payloads(conn, kept_aside)
        return outcomes

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
        """Start a new generation; None if there is no such task, or (nothing written) if it is
        not at ``expected_generation`` or not in one of ``expected_states``, when given."""
        conn = session.connection()
        guarded = expected_generation is not None or expected_states is not None
        # The new generation supersedes the unfinished children of the older ones: they are
        # cancelled (a running one is fenced out at its commit). Their rows and the task's are
        # locked first, in id order, in one pass, as every transaction that locks several task
        # rows takes them: a rerun that locked its task and then its children in the journal's
        # order could wait in a cycle with a dispatcher marking two of them. A child opened
        # between this read and the lock (a suspension that committed just then) is locked
        # after, alone.
        seen = journal.open_children(conn, task_id)
        if seen or guarded:
            self._lock_tasks(conn, sorted({task_id, *seen}))
        # Checked under the row's lock (SQLite: the write lock, taken at BEGIN IMMEDIATE): two
        # operators rerunning what they both listed start one generation, not two.
        if guarded and not _as_expected(conn, namespace, task_id, expected_generation, expected_states):
            return None
        row = submit.rerun_task(conn, namespace, task_id, now, due=due)
        if row is None:
            return None
        children = journal.open_children(conn, task_id)
        self._lock_tasks(conn, [c for c in children if c not in seen])
        for child_id in children:
            submit.cancel_task(conn, namespace, child_id, now)
        self._wake_dispatchers(conn, namespace)
        return row.generation

    def cancel(self, session: Session, namespace: str, task_id: str, now: datetime) -> bool | None:
        """Cancel a task with no final write yet, and the unfinished children its journal waits
        for, theirs too (nobody wants their results any more: a running one is fenced out at
        its commit). Their rows, the task's and its parent's are locked first, in id order, as
        :meth:`rerun` locks them."""
        conn = session.connection()
        parent_id = conn.execute(sa.select(tasks_table.c.parent_id).where(tasks_table.c.id == task_id)).scalar()
        descendants = _open_descendants(conn, task_id)
        family = {task_id, *descendants, *([parent_id] if parent_id else [])}
        if len(family) > 1:  # one row alone: its update locks it
            self._lock_tasks(conn, sorted(family))
        cancelled = submit.cancel_task(conn, namespace, task_id, now)
        if cancelled:
            late = [c for c in _open_descendants(conn, task_id) if c not in descendants]  # opened meanwhile
            self._lock_tasks(conn, late)
            for descendant in [*descendants, *late]:
                submit.cancel_task(conn, namespace, descendant, now)
            if parent_id:
                self._settle_if_child(conn, namespace, task_id, "CANCELLED", now)
        return cancelled


def _open_descendants(conn: sa.Connection, task_id: str) -> list[str]:
    """The unfinished children a task's journal waits for, and theirs, breadth first."""
    found: list[str] = []
    level = [task_id]
    while level:
        level = [c for parent in level for c in journal.open_children(conn, parent) if c not in found]
        found += level
    return found


def _as_expected(
    conn: sa.Connection, namespace: str, task_id: str, generation: int | None, states: Collection[str] | None
) -> bool:
    """Whether the task is at ``generation`` and in one of ``states`` (each when given)."""
    t = tasks_table.c
    row = conn.execute(sa.select(t.generation, t.state).where(t.id == task_id, t.namespace == namespace)).first()
    return (
        row is not None
        and (generation is None or row.generation == generation)
        and (states is None or row.state in states)
    )


def _keys(tasks: Sequence[NewTask]) -> list[tuple[int, tuple[str, str]]]:
    """(index, (name, key)) of the tasks that have an idempotency key."""
    return [(i, (task.name, task.idempotency_key)) for i, task in enumerate(tasks) if task.idempotency_key is not None]


def _holder(
    conn: sa.Connection, task: NewTask, key: str, holders: dict[tuple[str, str], SubmitOutcome]
) -> SubmitOutcome:
    """The task holding ``task``'s ``key``, as read back after the insert; a key the lookup's
    dict misses is compared by the database itself (its collation may match keys that differ
    as strings: MySQL's pads trailing spaces)."""
    holder = holders.get((task.name, key)) or submit.find_by_key(conn, task)
    if holder is None:  # pragma: no cover - the conflicting row must be visible now
        raise RuntimeError("idempotency conflict without a visible task")
    return holder
