"""Waking dispatchers after the runtime's own outbox writes, where the database cannot.

PostgreSQL's store NOTIFYs in the transaction that writes an outbox row. On SQLite and MySQL the
runtime publishes a wake-up on Redis (:mod:`durable_tasks.wakeup`): for a submit when the
caller's session commits, and for the rows the runtime writes itself (a suspension's children,
the resume written by a parent's last child, a retry, a redelivery) through the hook here, so an
agent run's hops do not wait for the dispatcher's poll.

Only a commit wakes them: a transaction or savepoint that rolls back took its rows away, and a
woken dispatcher would claim nothing. The transaction events that tell are listened to on the
connection that wrote an outbox row only (on the engine, they would make every connection join
the engine's event dispatch: tens of microseconds per transaction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

__all__ = ["CommitWakes"]

#: ``Connection.info`` keys (the pooled connection's): the outbox writes of the open transaction,
#: then the namespaces of its commit, woken once the connection is back in the pool.
_WRITTEN = "durable_tasks.outbox_written"
_COMMITTED = "durable_tasks.wake_at_checkin"


@dataclass(slots=True)
class _Written:
    """Namespaces written in one connection's open transaction, in order, and where each
    savepoint begun since the first write starts in that list (innermost last)."""

    conn: sa.Connection
    namespaces: list[str] = field(default_factory=list)
    savepoints: list[int] = field(default_factory=list)


class CommitWakes:
    """The default wake-up of a store: a hook called once the transaction has committed."""

    _engine: sa.Engine
    _on_outbox_commit: Callable[[str], None] | None = None

    def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None:
        """Called after an outbox row was written in ``conn``'s transaction (default: the
        hook of :meth:`wake_on_commit` once it committed; else dispatchers poll)."""
        if self._on_outbox_commit is None:
            return
        written = conn.info.get(_WRITTEN)
        if written is None or written.conn is not conn:
            written = conn.info[_WRITTEN] = _Written(conn)
            for name, listener in _LISTENERS.items():
                if not sa.event.contains(conn, name, listener):
                    sa.event.listen(conn, name, listener)
        written.namespaces.append(namespace)

    def wake_on_commit(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(namespace)`` after a transaction of the runtime's own that wrote outbox
        rows (a suspension's children, a resume, a redelivery) has committed: the runtime
        publishes its wake-up on Redis there, as for a submit, where the database wakes no
        dispatcher. Rows rolled back (with their transaction or savepoint) call nothing, nor
        does a commit that fails.

        It runs when the connection goes back to the pool: SQLAlchemy's ``commit`` event comes
        before the database's commit, and a dispatcher woken then would skip the row."""
        if self._on_outbox_commit is None:
            sa.event.listen(self._engine, "checkin", self._checked_in)
            sa.event.listen(self._engine, "handle_error", _failed)  # the dialect's: no cost per connection
        self._on_outbox_commit = hook

    def _checked_in(self, _dbapi_connection: object, record: object) -> None:
        info = getattr(record, "info", None)
        hook = self._on_outbox_commit
        if info is not None and hook is not None and _COMMITTED in info:
            for namespace in info.pop(_COMMITTED):
                hook(namespace)


def _written(conn: sa.Connection) -> _Written | None:
    written = conn.info.get(_WRITTEN)
    return written if written is not None and written.conn is conn else None


def _committing(conn: sa.Connection) -> None:
    written = conn.info.pop(_WRITTEN, None)
    if written is not None and written.conn is conn and written.namespaces:
        conn.info.setdefault(_COMMITTED, set()).update(written.namespaces)


def _rolled_back(conn: sa.Connection) -> None:
    conn.info.pop(_WRITTEN, None)


def _savepoint(conn: sa.Connection, _name: str) -> None:
    if written := _written(conn):
        written.savepoints.append(len(written.namespaces))


def _released(conn: sa.Connection, _name: str, _context: object) -> None:
    # Savepoints nest: the innermost one seen begin is the one ending; with none seen, it began
    # before the first write.
    if (written := _written(conn)) and written.savepoints:
        written.savepoints.pop()


def _savepoint_rolled_back(conn: sa.Connection, _name: str, _context: object) -> None:
    if written := _written(conn):
        # Every write since it began is gone; one begun before the first write takes them all.
        del written.namespaces[written.savepoints.pop() if written.savepoints else 0 :]


def _failed(context: sa.engine.ExceptionContext) -> None:
    # No statement: the commit (or a rollback) itself failed, so nothing is known committed.
    if context.statement is None and context.connection is not None:
        context.connection.info.pop(_COMMITTED, None)
        context.connection.info.pop(_WRITTEN, None)


_LISTENERS: dict[str, Callable[..., None]] = {
    "commit": _committing,
    "rollback": _rolled_back,
    "savepoint": _savepoint,
    "release_savepoint": _released,
    "rollback_savepoint": _savepoint_rolled_back,
}
