"""The loops' door to the store: the hot one-statement transactions without a thread hand-off.

A statement sent from a worker thread wakes that thread, which sends it, sleeps until the
reply and then wakes the event loop: three wake-ups where a connection of the loop's own
needs one. At a low task rate every wake-up finds a cold CPU; on the benchmark machine a
paced ``SELECT 1`` cost 690-735 µs from a thread and 548-557 µs on an async connection, and
about 230 µs less CPU (docs/performance.md, fifth round).

:class:`LoopStore` is what the dispatcher and the worker call. On PostgreSQL it sends the
store's :class:`~.statement.OneStatement` values on :class:`AsyncConnections` (autocommit
psycopg connections of ONE event loop); on SQLite, and for the rare multi-statement cases
(a pass with dead or held rows, a group with on-commit hooks, a claim's follow-ups), it runs
the store's sync function in a worker thread as before. Errors come out as SQLAlchemy's
DBAPIError family either way: the callers treat those as an outage.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import anyio
import psycopg
import sqlalchemy as sa
from anyio import to_thread

from . import execution, outbox, results
from .engine import PING_IF_IDLE_S, RUNTIME_SESSION_SQL, is_postgres, wrapped_error
from .statement import OneStatement, Rows

__all__ = ["AsyncConnections", "LoopStore"]

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: Statements in flight at once on one loop's connections (the worker has two claims and two
#: group commits in flight, the dispatcher two passes, lease renewals come on top).
MAX_CONNECTIONS = 8


class AsyncConnections:
    """Autocommit psycopg connections of ONE event loop, each reused statement after statement.

    A connection idle for :data:`~.engine.PING_IF_IDLE_S` is pinged before reuse (as the
    engine's pool does) and replaced if dead; one that raised, or whose statement was
    interrupted, is closed rather than reused.
    """

    def __init__(self, engine: sa.Engine, *, max_size: int = MAX_CONNECTIONS) -> None:
        self._dialect = engine.dialect
        self._conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
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
            async with conn.cursor() as cursor:
                await cursor.execute(statement.sql, statement.params)
                rows: Rows = await cursor.fetchall() if cursor.description else []
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
            if anyio.current_time() - since < PING_IF_IDLE_S:
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
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        try:
            await conn.execute(RUNTIME_SESSION_SQL)  # keyed plans, whatever the statistics say
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


class LoopStore:
    """The hot paths of the dispatcher and the worker, as coroutines of one event loop."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.connections = AsyncConnections(engine) if is_postgres(engine) else None

    async def _run(self, statement: OneStatement[R]) -> R:
        assert self.connections is not None
        return await self.connections.run(statement)

    async def lease_outbox(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> list[outbox.ClaimedDelivery]:
        """Lease up to ``limit`` due outbox rows (:func:`.outbox.claim_batch`)."""
        if self.connections is None:
            return await to_thread.run_sync(
                partial(
                    outbox.claim_batch, self.engine, namespace, now=now, lease=lease, limit=limit, watermark=watermark
                )
            )
        return await self._run(
            outbox.claim_statement(namespace, now=now, lease=lease, limit=limit, watermark=watermark)
        )

    async def settle_outbox(
        self,
        *,
        sent: Sequence[tuple[outbox.ClaimedDelivery, str, int | None]],
        dead: Sequence[tuple[outbox.ClaimedDelivery, str]],
        retry: Sequence[tuple[outbox.ClaimedDelivery, datetime, str]],
        held: Sequence[outbox.ClaimedDelivery],
        now: datetime,
        release_at: datetime,
    ) -> int:
        """Record a dispatch pass's outcomes (:func:`.outbox.settle_batch`); returns rows marked SENT."""
        if self.connections is not None and (
            usual := outbox.settle_statement(sent=sent, dead=dead, retry=retry, held=held, now=now)
        ):
            return await self._run(usual)
        return await to_thread.run_sync(
            partial(
                outbox.settle_batch,
                self.engine,
                sent=sent,
                dead=dead,
                retry=retry,
                held=held,
                now=now,
                release_at=release_at,
            )
        )

    async def claim_executions(
        self,
        namespace: str,
        requests: Sequence[execution.ClaimRequest],
        *,
        worker_id: str,
        now: datetime,
        lease: timedelta,
    ) -> list[execution.ExecutionClaim | execution.ClaimRefused]:
        """Take the execution fence for a read batch (:func:`.execution.claim_batch`)."""
        if not requests:
            return []
        if self.connections is None:
            return await to_thread.run_sync(
                partial(
                    execution.claim_batch, self.engine, namespace, requests, worker_id=worker_id, now=now, lease=lease
                )
            )
        rows = await self._run(
            execution.claim_statement(namespace, requests, worker_id=worker_id, now=now, lease=lease)
        )
        follow_ups = execution.claim_follow_ups(requests, rows)
        known = (
            await to_thread.run_sync(execution.after_claim, self.engine, namespace, follow_ups, now)
            if follow_ups
            else execution.NOTHING_KNOWN
        )
        return execution.claims_for(requests, rows, known, namespace=namespace, worker_id=worker_id)

    async def commit_results(self, writes: Sequence[results.FinalWrite], *, now: datetime) -> None:
        """Commit a group of results, each fenced on its own (:func:`.results.commit_results`)."""
        if self.connections is not None and (alone := results.commit_statement(writes, now=now)):
            await self._run(alone)
            return
        await to_thread.run_sync(partial(results.commit_results, self.engine, writes, now=now))

    def close(self) -> None:
        """Close the idle connections (see :meth:`AsyncConnections.close`)."""
        if self.connections is not None:
            self.connections.close()
