"""Waking dispatchers after the runtime's own outbox writes, where the database cannot.

PostgreSQL's store NOTIFYs in the transaction that writes an outbox row. On SQLite and MySQL the
runtime publishes a wake-up on Redis (:mod:`durable_tasks.wakeup`): for a submit when the
caller's session commits, and for the rows the runtime writes itself (a suspension's children,
the resume written by a parent's last child, a retry, a redelivery) through the hook here, so an
agent run's hops do not wait for the dispatcher's poll.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

__all__ = ["CommitWakes"]

#: ``Connection.info`` key: namespaces whose dispatchers to wake when the connection is returned.
_WAKE_AT_CHECKIN = "durable_tasks.wake_at_checkin"


class CommitWakes:
    """The default wake-up of a store: a hook called once the transaction is over."""

    _engine: sa.Engine
    _on_outbox_commit: Callable[[str], None] | None = None

    def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None:
        """Called after an outbox row was written in ``conn``'s transaction (default: the
        hook of :meth:`wake_on_commit` once the connection is returned; else dispatchers poll)."""
        if self._on_outbox_commit is not None:
            conn.info.setdefault(_WAKE_AT_CHECKIN, set()).add(namespace)

    def wake_on_commit(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(namespace)`` after a transaction of the runtime's own that wrote outbox
        rows (a suspension's children, a resume, a redelivery) has ended: the runtime publishes
        its wake-up on Redis there, as for a submit, where the database wakes no dispatcher.

        It runs when the connection goes back to the pool, after the commit (SQLAlchemy's
        ``commit`` event comes before it, and a dispatcher woken then would skip the row); a
        rolled-back transaction wakes them for nothing, which costs one claim that finds none."""
        if self._on_outbox_commit is None:
            sa.event.listen(self._engine, "checkin", self._checked_in)
        self._on_outbox_commit = hook

    def _checked_in(self, _dbapi_connection: object, record: object) -> None:
        info = getattr(record, "info", None)
        hook = self._on_outbox_commit
        if info is not None and hook is not None and _WAKE_AT_CHECKIN in info:
            for namespace in info.pop(_WAKE_AT_CHECKIN):
                hook(namespace)
