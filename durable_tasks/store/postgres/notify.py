"""PostgreSQL's wake-up: a dispatcher LISTENs on the channel every submit NOTIFYs on commit."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import sqlalchemy as sa

from ...urls import safe_url
from ..pooler import conninfo, notify_reaches
from .statements import NOTIFY_CHANNEL

__all__ = ["LISTEN_CHECK", "PostgresNotifyWaiter"]

logger = logging.getLogger(__name__)

#: How long a new listener waits for its own test notification.
LISTEN_CHECK = timedelta(seconds=2)


class PostgresNotifyWaiter:
    """LISTENs on the submit channel; a notification for our namespace ends the wait.

    On connecting it checks that a NOTIFY sent as a submit sends it (through ``notify_url``,
    the application's URL) reaches the listener within ``check_timeout``. Behind a pooler in
    transaction mode it does not (the LISTEN stays on a server connection the listener no
    longer holds): the waiter then says so once and polls, which is what it would silently
    have done anyway. A direct URL for the listener (``DT_LISTEN_DATABASE_URL``) restores
    immediate wake-ups.
    """

    def __init__(
        self, url: sa.URL, namespace: str, *, notify_url: sa.URL | None = None, check_timeout: timedelta = LISTEN_CHECK
    ) -> None:
        self._conninfo = conninfo(url)
        self._notify_conninfo = conninfo(notify_url or url)
        self._shown_url = safe_url(conninfo(url))
        self._namespace = namespace
        self._check_timeout = check_timeout.total_seconds()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._polling = False  # NOTIFY does not reach the listener: poll from now on
        self._woken = False  # our namespace was notified during the check
        self._warned = False  # the fall back to polling was reported

    async def _connection(self) -> psycopg.AsyncConnection[Any] | None:
        if self._conn is None:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, prepare_threshold=None)
            try:
                await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                arrived, others = await notify_reaches(
                    conn, self._notify_conninfo, NOTIFY_CHANNEL, timeout=self._check_timeout
                )
            except BaseException:
                await conn.close()
                raise
            if not arrived:
                await conn.close()
                self._polling = True
                return None
            self._woken = self._namespace in others
            self._conn = conn
        return self._conn

    async def listen(self) -> None:
        """LISTEN now (and check that a NOTIFY arrives), so a submit committed from here on
        ends the next wait; a failure is left to :meth:`wait`, which reports it and polls."""
        if self._polling:
            return
        try:
            await self._connection()
        except psycopg.Error as exc:
            logger.debug("LISTEN failed (%s); the wait retries it", exc)

    async def wait(self, timeout: timedelta) -> None:
        """Return on a NOTIFY for this namespace, or after ``timeout``."""
        try:
            conn = None if self._polling else await self._connection()
            if conn is None:
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "NOTIFY does not reach a LISTEN on %s (a pooler in transaction mode?): polling the outbox "
                        "every %.1f s instead; set DT_LISTEN_DATABASE_URL to a direct connection to PostgreSQL",
                        self._shown_url,
                        timeout.total_seconds(),
                    )
                await anyio.sleep(timeout.total_seconds())
                return
            if self._woken:
                self._woken = False
                return
            deadline = anyio.current_time() + timeout.total_seconds()
            while (remaining := deadline - anyio.current_time()) > 0:
                async for note in conn.notifies(timeout=remaining, stop_after=1):
                    if note.payload == self._namespace:
                        return
        except psycopg.Error as exc:
            logger.warning("LISTEN failed (%s); polling instead", exc)
            await self.aclose()
            await anyio.sleep(timeout.total_seconds())

    async def aclose(self) -> None:
        """Close the listening connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()
