"""How the dispatcher waits for work: a Postgres NOTIFY wakes it at once; polling is the fallback."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Protocol

import anyio
import sqlalchemy as sa

from .store.submit import NOTIFY_CHANNEL

__all__ = ["OutboxWaiter", "PollingWaiter", "PostgresNotifyWaiter", "waiter_for"]

logger = logging.getLogger(__name__)


class OutboxWaiter(Protocol):
    """Blocks until new outbox rows may be due, or the timeout passes."""

    async def wait(self, timeout: timedelta) -> None: ...

    async def aclose(self) -> None: ...


class PollingWaiter:
    """Sleeps the poll interval (SQLite, or when LISTEN is unavailable)."""

    async def wait(self, timeout: timedelta) -> None:
        """Sleep for ``timeout``."""
        await anyio.sleep(timeout.total_seconds())

    async def aclose(self) -> None:
        """Nothing to release."""


class PostgresNotifyWaiter:
    """LISTENs on the submit channel; a notification for our namespace ends the wait."""

    def __init__(self, url: sa.URL, namespace: str) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._namespace = namespace
        self._conn: object | None = None

    async def _connection(self) -> object:
        import psycopg

        if self._conn is None:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self._conn = conn
        return self._conn

    async def wait(self, timeout: timedelta) -> None:
        """Return on a NOTIFY for this namespace, or after ``timeout``."""
        import psycopg

        try:
            conn = await self._connection()
            assert isinstance(conn, psycopg.AsyncConnection)
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
        import psycopg

        conn, self._conn = self._conn, None
        if isinstance(conn, psycopg.AsyncConnection):
            with anyio.CancelScope(shield=True):
                await conn.close()


def waiter_for(engine: sa.Engine, namespace: str) -> OutboxWaiter:
    """NOTIFY-driven on PostgreSQL, polling elsewhere."""
    if engine.dialect.name == "postgresql":
        return PostgresNotifyWaiter(engine.url, namespace)
    return PollingWaiter()
