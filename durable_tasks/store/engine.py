"""What every dialect's engine shares: the read-only view, the idle ping, driver errors as
SQLAlchemy's. Each store configures its own engine (:func:`.factory.open_store`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

__all__ = ["PING_IF_IDLE_S", "READ_ONLY", "ping_when_idle", "read_only", "wrapped_error"]

#: Execution option of read-only work: a dialect whose writers take a lock up front (SQLite's
#: BEGIN IMMEDIATE) opens these transactions without it.
READ_ONLY = "dt_read_only"

#: A pooled connection idle this long is pinged before it is handed out.
PING_IF_IDLE_S = 1.0


def ping_when_idle(engine: sa.Engine) -> None:
    """Ping a pooled connection before reuse only if it sat idle for ``PING_IF_IDLE_S``.

    ``pool_pre_ping`` pings on every checkout: one more round trip for every transaction,
    and on a busy machine each round trip waits to be scheduled at both ends. A connection
    back in the pool within the last second was alive then; one that fails anyway raises a
    disconnect error, which makes SQLAlchemy invalidate the whole pool, and every caller of a
    hot path treats a database error as transient (the entry stays pending, the row keeps its
    lease). A dead idle connection is replaced before use: the pool retries the checkout.
    """

    @sa.event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["dt_idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("dt_idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_IF_IDLE_S:
            return  # new, or back in the pool a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise sa.exc.DisconnectionError(f"pooled connection is dead: {exc}") from exc
        if not alive:
            raise sa.exc.DisconnectionError("pooled connection is dead")


def read_only(engine: sa.Engine) -> sa.Engine:
    """The same engine and pool, for read-only work (on SQLite its transactions do not take
    the write lock)."""
    return engine.execution_options(**{READ_ONLY: True})


def wrapped_error(
    dialect: sa.Dialect, statement: str, params: Mapping[str, Any], exc: Exception, *, invalidated: bool
) -> sa.exc.StatementError:
    """A driver error as SQLAlchemy's Connection would raise it (the DBAPIError family)."""
    return sa.exc.DBAPIError.instance(
        statement,
        dict(params),
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=invalidated,
        dialect=dialect,
    )
