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
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.orm import Session

from . import journal, submit
from .ids import new_task_id
from .submit import NewTask, SubmitOutcome

__all__ = ["SubmitStore"]


class SubmitStore:
    """submit, rerun and cancel; the concrete store supplies the dialect's hooks."""

    #: Whether :meth:`_insert_task` of a taken idempotency key writes and locks nothing, so a
    #: key need not be looked up before the insert (see the module's docstring).
    insert_ignores_taken_keys = False

    if TYPE_CHECKING:  # the concrete store's (defined there, not stubbed here: the MRO would pick a stub)

        def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None: ...

        def _settle_if_child(
            self, conn: sa.Connection, namespace: str, task_id: str, state: str, now: datetime
        ) -> None: ...

        def _lock_with_parent_of(self, conn: sa.Connection, task_id: str) -> bool: ...

        def _lock_tasks(self, conn: sa.Connection, task_ids: Sequence[str]) -> None: ...

    def _insert_task(self, conn: sa.Connection, task: NewTask, task_id: str, now: datetime) -> bool:
        """Insert the task row and its first outbox row, waking dispatchers; False (nothing
        written) when the idempotency key is taken."""
        raise NotImplementedError

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
        if self._insert_task(conn, task, task_id, now):
            return SubmitOutcome(task_id, 0, created=True)
        existing = submit.find_by_key(conn, task)  # the key is taken (by a concurrent submit, or before)
        if existing is None:  # pragma: no cover - the conflicting row must be visible now
            raise RuntimeError("idempotency conflict without a visible task")
        return existing

    def submit_many(self, session: Session, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """Each task as :meth:`submit` writes it, in order."""
        return [self.submit(session, task, now) for task in tasks]

    def _submit_children(self, conn: sa.Connection, tasks: Sequence[NewTask], now: datetime) -> list[SubmitOutcome]:
        """A suspension's children (:func:`.journal.child_task`), each as :meth:`submit` writes
        it, in order, in the suspension's transaction."""
        return [self._submit_conn(conn, task, now) for task in tasks]

    def rerun(
        self, session: Session, namespace: str, task_id: str, now: datetime, *, due: datetime | None = None
    ) -> int | None:
        """Start a new generation; None if there is no such task."""
        conn = session.connection()
        # The new generation supersedes the unfinished children of the older ones: they are
        # cancelled (a running one is fenced out at its commit). Their rows and the task's are
        # locked first, in id order, in one pass, as every transaction that locks several task
        # rows takes them: a rerun that locked its task and then its children in the journal's
        # order could wait in a cycle with a dispatcher marking two of them. A child opened
        # between this read and the lock (a suspension that committed just then) is locked
        # after, alone.
        seen = journal.open_children(conn, task_id)
        if seen:
            self._lock_tasks(conn, sorted({task_id, *seen}))
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
        """Cancel a task with no final write yet."""
        conn = session.connection()
        child = self._lock_with_parent_of(conn, task_id)
        cancelled = submit.cancel_task(conn, namespace, task_id, now)
        if cancelled and child:
            self._settle_if_child(conn, namespace, task_id, "CANCELLED", now)
        return cancelled
