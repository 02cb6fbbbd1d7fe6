"""The loops' own PostgreSQL connections: the hot one-statement transactions without a
thread hand-off.

A statement sent from a worker thread wakes that thread, which sends it, sleeps until the
reply and then wakes the event loop: three wake-ups where a connection of the loop's own
needs one, and at a low task rate every wake-up finds a cold CPU. :class:`AsyncConnections`
are autocommit psycopg connections of ONE event loop; the store keeps one set per loop
(:class:`~durable_tasks.loopbound.LoopBound`). Errors come out as SQLAlchemy's DBAPIError
family, as from a pooled connection: the callers treat those as an outage.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import anyio
import psycopg
import sqlalchemy as sa
from anyio import to_thread
from psycopg import pq

from .. import engine as engine_options
from ..engine import wrapped_error
from ..pooler import PathProbe, Pooling, conninfo
from .planner import SESSION_SQL, TRANSACTION_SQL
from .statements import OneStatement, Rows

__all__ = ["MAX_CONNECTIONS", "AsyncConnections"]

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: Statements in flight at once on one loop's connections (the worker has two claims and two
#: group commits in flight, the dispatcher two passes, lease renewals come on top).
MAX_CONNECTIONS = 8


def _returns_rows(cursor: psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows to fetch: what ``cursor.description`` tells,
    without building its Column objects (one per column on every access: a claim returns 22,
    a share of what one statement costs the loop's thread at a low rate)."""
    result = cursor.pgresult
    return result is not None and (result.nfields > 0 or result.status == pq.ExecStatus.TUPLES_OK)


class AsyncConnections:
    """Autocommit psycopg connections of ONE event loop, each reused statement after statement.

    A connection idle for :data:`~..engine.PING_IF_IDLE_S` is pinged before reuse (as the
    engine's pool does) and replaced if dead; one that raised, or whose statement was
    interrupted, is closed rather than reused.
    """

    def __init__(self, engine: sa.Engine, *, max_size: int = MAX_CONNECTIONS, probe: PathProbe | None = None) -> None:
        self._dialect = engine.dialect
        self._conninfo = conninfo(engine.url)
        self._probe = probe or PathProbe(self._conninfo)
        self._own_sessions: bool | None = None  # known once the first connection opens
        self._idle: list[tuple[psycopg.AsyncConnection[Any], float]] = []
        self._slots = anyio.Semaphore(max_size)

    async def run(self, statement: OneStatement[R]) -> R:
        """Send ``statement`` and read its rows. Once sent, it finishes even if the caller is
        cancelled (as a statement in a worker thread does): its outcome is then known."""
        async with self._slots:
            conn = await self._checkout(statement)
            with anyio.CancelScope(shield=True):
                rows = await self._execute(conn, statement)
        return statement.read(rows)

    async def _execute(self, conn: psycopg.AsyncConnection[Any], statement: OneStatement[Any]) -> Rows:
        reusable = False
        try:
            if self._own_sessions:
                async with conn.cursor() as cursor:
                    await cursor.execute(statement.sql, statement.params, prepare=statement.prepare)
                    rows: Rows = await cursor.fetchall() if _returns_rows(cursor) else []
            else:
                # Behind a pooler: the setting travels with the statement, in one message (one
                # round trip, one implicit transaction), and ends with it.
                async with psycopg.AsyncClientCursor(conn) as client_side:
                    await client_side.execute(f"{TRANSACTION_SQL}; {statement.sql}", statement.params)
                    client_side.nextset()
                    rows = await client_side.fetchall() if _returns_rows(client_side) else []
            reusable = True
            return rows
        except psycopg.Error as exc:
            raise wrapped_error(self._dialect, statement.sql, statement.params, exc, invalidated=True) from exc
        finally:
            if reusable:
                self._idle.append((conn, anyio.current_time()))
            else:
                await conn.close()

    async def _checkout(self, statement: OneStatement[Any]) -> psycopg.AsyncConnection[Any]:
        while self._idle:
            conn, since = self._idle.pop()
            if anyio.current_time() - since < engine_options.PING_IF_IDLE_S:
                return conn
            try:
                await conn.execute("SELECT 1")
                return conn
            except psycopg.Error as exc:
                logger.info("an idle database connection was dead (%s); opening another", exc)
                await conn.close()
            except BaseException:  # cancelled mid-ping: its state is unknown, never reuse it
                await conn.close()
                raise
        try:
            return await self._open()
        except psycopg.Error as exc:
            raise wrapped_error(self._dialect, statement.sql, statement.params, exc, invalidated=False) from exc

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        if self._own_sessions is None:
            self._own_sessions = (await to_thread.run_sync(self._probe.report)).pooling is Pooling.DIRECT
        if not self._own_sessions:  # simple-query statements, never prepared
            return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, prepare_threshold=None)
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        try:
            # Keyed plans, whatever the statistics say (.planner), on a session of the runtime's
            # own that no other client is ever handed.
            await conn.execute(SESSION_SQL)
        except BaseException:  # failed or cancelled before it was handed out: never used
            conn.pgconn.finish()  # no await: this may run while cancelled
            raise
        return conn

    @property
    def idle(self) -> int:
        """How many connections wait for the next statement."""
        return len(self._idle)

    def close(self) -> None:
        """Close the idle connections; callable from any thread or loop (closing does not wait on the server)."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.pgconn.finish()
