"""What sits between the runtime and PostgreSQL: a pooler, its pooling mode, and whether
LISTEN/NOTIFY reaches a listener through it.

Most production PostgreSQL is reached through a pooler in *transaction* mode (PgBouncer, RDS
Proxy, Supavisor, pgcat): each transaction may run on another server connection, shared with
other clients. There, session state (``SET``, prepared statements, ``LISTEN``) is not the
client's own: a LISTEN stays behind on a server connection the client no longer holds, and its
notifications never arrive. These probes tell, from the client side, with no access to the
pooler's console.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

import anyio
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

__all__ = ["Pooling", "PoolingReport", "conninfo", "detect_pooling", "listen_reaches", "notify_reaches"]

#: The URL query parameters the runtime reads itself: never handed to libpq, which refuses
#: parameters it does not know.
RUNTIME_PARAMS = frozenset({"prepare_threshold"})


class Pooling(enum.Enum):
    """What the client-side probe found between the runtime and PostgreSQL."""

    DIRECT = "direct"
    SESSION = "session"  # a pooler that keeps one server connection per client connection
    TRANSACTION = "transaction"  # server connections change between transactions


@dataclass(frozen=True, slots=True)
class PoolingReport:
    """The probe's verdict and the evidence for it."""

    pooling: Pooling
    evidence: str


def conninfo(url: sa.URL | str) -> str:
    """A libpq connection string for a SQLAlchemy PostgreSQL URL (``postgres://`` included),
    without the parameters only the runtime reads."""
    parsed = make_url(url) if isinstance(url, str) else url
    query = {k: v for k, v in parsed.query.items() if k not in RUNTIME_PARAMS}
    return parsed.set(drivername="postgresql", query=query).render_as_string(hide_password=False)


async def _pid(conn: psycopg.AsyncConnection[tuple[int]]) -> int:
    cursor = await conn.execute("SELECT pg_backend_pid()", prepare=False)
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def detect_pooling(dsn: str, *, timeout: float = 5.0) -> PoolingReport:
    """Probe the path to PostgreSQL with two client connections.

    A pooler answers the client's startup with a backend key of its own, so the pid the client
    was told differs from ``pg_backend_pid()``. In transaction mode a client's server
    connection is handed to another client between its transactions: while a second client
    holds a transaction open, the first one's next statement runs on another backend (or waits
    for one, when the pool has no other).
    """
    first = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None)
    try:
        told, before = first.info.backend_pid, await _pid(first)
        second = await psycopg.AsyncConnection.connect(dsn, prepare_threshold=None)
        try:
            held = await _pid(second)  # a transaction open on ``second`` from here on
            after: int | None = None
            with anyio.move_on_after(timeout):
                after = await _pid(first)
            await second.rollback()
        finally:
            await second.close()
    finally:
        await first.close()
    if after is None:
        return PoolingReport(Pooling.TRANSACTION, "a client waited for a server connection another client held")
    if after != before or held == before:
        return PoolingReport(
            Pooling.TRANSACTION, f"one client connection ran on backends {before} and {after} (another on {held})"
        )
    if told != before:
        return PoolingReport(
            Pooling.SESSION, f"the backend pid given at connect ({told}) is not the server's ({before})"
        )
    return PoolingReport(Pooling.DIRECT, f"backend {before} throughout")


async def notify_reaches(
    listener: psycopg.AsyncConnection[object], notify_dsn: str, channel: str, *, timeout: float
) -> tuple[bool, list[str]]:
    """Send a NOTIFY on ``channel`` from another connection to ``notify_dsn`` (as a submit
    does) and wait up to ``timeout`` for ``listener`` (already LISTENing) to receive it.

    Returns whether it arrived, and the payloads of the other notifications received meanwhile
    (the caller's own wake-ups must not be lost to the probe).
    """
    token = f"durable_tasks.listen-check:{uuid.uuid4().hex}"
    others: list[str] = []
    async with await psycopg.AsyncConnection.connect(notify_dsn, autocommit=True, prepare_threshold=None) as other:
        await other.execute("SELECT pg_notify(%s, %s)", (channel, token), prepare=False)
    deadline = anyio.current_time() + timeout
    while (remaining := deadline - anyio.current_time()) > 0:
        async for note in listener.notifies(timeout=remaining, stop_after=1):
            if note.payload == token:
                return True, others
            others.append(note.payload)
    return False, others


async def listen_reaches(listen_dsn: str, notify_dsn: str, channel: str, *, timeout: float) -> bool:
    """Whether a LISTEN on ``listen_dsn`` hears a NOTIFY sent through ``notify_dsn``."""
    listener = await psycopg.AsyncConnection.connect(listen_dsn, autocommit=True, prepare_threshold=None)
    try:
        await listener.execute(f"LISTEN {channel}")
        arrived, _ = await notify_reaches(listener, notify_dsn, channel, timeout=timeout)
        return arrived
    finally:
        await listener.close()
