"""The planner setting of the runtime's statements on PostgreSQL, in one place.

Every runtime statement finds its rows by key or through an index (arrays of ids,
ix_dt_outbox_pending_due, ix_dt_tasks_sent), and a prepared statement keeps the generic plan it
got when psycopg prepared it, until the next ANALYZE. A queue's tables are small when its
processes start (a new deployment, a new namespace, a fresh schema): the planner then prefers
sequential scans, and a plan made then goes on scanning the whole table on every pass as it
grows. With sequential scans priced out, the keyed plan is the cheapest on any table size,
with or without statistics.

No session state on a connection another client may get: the setting is ``SET LOCAL`` at the
start of each of the runtime's transactions on the application's pool (:func:`runtime_plans`),
whose connections thus keep their own settings, and, on the loops' own connections
(:mod:`.connections`), part of each statement's message behind a pooler. Only on a direct
connection, whose session is the runtime's alone, does a loop's connection set it once as it
opens (:data:`SESSION_SQL`), so its prepared statements skip that statement. A SET rather than a
startup ``options`` parameter: poolers such as PgBouncer refuse (or drop) that parameter.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..engine import wrapped_error

__all__ = ["SESSION_SQL", "TRANSACTION_SQL", "plan_runtime_transactions", "runtime_plans"]

_SETTING = "enable_seqscan = off"
#: Run on each of the loops' own connections as it opens, on a direct connection only: that
#: session is the runtime's alone. Behind a pooler another client could be handed it.
SESSION_SQL = f"SET {_SETTING}"
#: Behind a pooler, sent with each statement of the loops' connections, and at the start of
#: each of the runtime's transactions on the application's pool: it ends with the transaction.
TRANSACTION_SQL = f"SET LOCAL {_SETTING}"

#: Execution option marking the runtime's own transactions on the application's pool.
_RUNTIME_PLANS = "dt_runtime_plans"


def runtime_plans(engine: sa.Engine) -> sa.Engine:
    """The same engine and pool, for the runtime's own transactions: each starts with
    ``SET LOCAL enable_seqscan = off``, which ends with the transaction; the application's
    transactions on the pool never see it (needs :func:`plan_runtime_transactions`)."""
    return engine.execution_options(**{_RUNTIME_PLANS: True})


def plan_runtime_transactions(engine: sa.Engine) -> None:
    """Make the transactions of :func:`runtime_plans` views of ``engine`` start with the setting."""

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        if conn.get_execution_options().get(_RUNTIME_PLANS):
            # On the driver's connection: psycopg opens the transaction with this statement.
            driver = conn.connection.driver_connection
            assert driver is not None
            try:
                driver.execute(TRANSACTION_SQL)
            except conn.dialect.loaded_dbapi.Error as exc:  # as from any statement: never reused
                conn.invalidate()
                raise wrapped_error(conn.dialect, TRANSACTION_SQL, {}, exc, invalidated=True) from exc
