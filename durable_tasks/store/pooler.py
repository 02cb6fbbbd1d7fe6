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
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ..errors import ConfigurationError
from ..settings import PrepareThreshold, parse_prepare_threshold

__all__ = [
    "PSYCOPG_PREPARE_THRESHOLD",
    "PathProbe",
    "Pooling",
    "PoolingReport",
    "conninfo",
    "decide_prepare_threshold",
    "detect_pooling",
    "listen_reaches",
    "notify_reaches",
    "prepare_as_decided",
    "split_prepare_threshold",
]

logger = logging.getLogger(__name__)

#: psycopg's own default: a statement is prepared on its sixth execution on a connection.
PSYCOPG_PREPARE_THRESHOLD = 5

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


def _pid(conn: psycopg.Connection[tuple[int]]) -> int:
    row = conn.execute("SELECT pg_backend_pid()", prepare=False).fetchone()
    assert row is not None
    return int(row[0])


def detect_pooling(dsn: str, *, tries: int = 5) -> PoolingReport:
    """Probe the path to PostgreSQL with two client connections, statement by statement.

    A pooler answers the client's startup with a backend key of its own, so the pid the client
    was told differs from ``pg_backend_pid()``. In transaction mode a server connection goes
    back to the pool after each transaction, and PgBouncer hands out the one used last: the
    second client's next statement runs on the backend the first client just used, which never
    happens on direct connections nor in session mode.
    """
    with (
        psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as first,
        psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as second,
    ):
        told = first.info.backend_pid
        ran: tuple[set[int], set[int]] = (set(), set())
        for _ in range(tries):
            ran[0].add(_pid(first))
            ran[1].add(_pid(second))
            if shared := ran[0] & ran[1]:
                return PoolingReport(Pooling.TRANSACTION, f"backend {min(shared)} served two client connections")
        if len(ran[0]) > 1:
            backends = ", ".join(map(str, sorted(ran[0])))
            return PoolingReport(Pooling.TRANSACTION, f"one client connection ran on backends {backends}")
    (backend,) = ran[0]
    if told != backend:
        evidence = f"the backend pid given at connect ({told}) is not the server's ({backend})"
        return PoolingReport(Pooling.SESSION, evidence)
    return PoolingReport(Pooling.DIRECT, f"backend {backend} throughout")


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


def split_prepare_threshold(url: sa.URL) -> tuple[sa.URL, PrepareThreshold]:
    """``url`` without its ``prepare_threshold`` query parameter (libpq does not know it, and
    SQLAlchemy would hand psycopg the text), and that parameter's value (``auto`` if absent)."""
    value = url.query.get("prepare_threshold")
    if value is None:
        return url, "auto"
    text = value[-1] if isinstance(value, tuple) else value
    try:
        asked: PrepareThreshold = parse_prepare_threshold(text)
    except ValueError as exc:
        raise ConfigurationError(f"the database URL's {exc}") from exc
    return url.difference_update_query(["prepare_threshold"]), asked


def decide_prepare_threshold(asked: PrepareThreshold, pooling: Callable[[], Pooling]) -> int | None:
    """psycopg's threshold for the connections: off when asked, and off behind a pooler in
    transaction mode whatever was asked (a statement prepared on one server connection is
    missing, or another, on the next); ``auto`` is psycopg's default elsewhere. ``pooling`` is
    called only when the answer depends on it."""
    if asked is None or pooling() is Pooling.TRANSACTION:
        return None
    return PSYCOPG_PREPARE_THRESHOLD if asked == "auto" else asked


class PathProbe:
    """What sits between an engine and PostgreSQL, probed once by whoever asks first (any
    thread). A probe that fails is not kept (the next question probes again) and counts as a
    pooler in transaction mode meanwhile: what is safe there is safe everywhere."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._lock = threading.Lock()
        self._report: PoolingReport | None = None

    def report(self) -> PoolingReport:
        """The probe's verdict (blocks for a few round trips the first time)."""
        with self._lock:
            if self._report is None:
                try:
                    self._report = detect_pooling(self._dsn)
                except psycopg.Error as exc:
                    return PoolingReport(Pooling.TRANSACTION, f"the probe failed: {exc}")
                if self._report.pooling is not Pooling.DIRECT:
                    logger.info(
                        "PostgreSQL is reached through a pooler in %s mode (%s)",
                        self._report.pooling.value,
                        self._report.evidence,
                    )
            return self._report

    @property
    def direct(self) -> bool:
        """Whether the runtime's connections reach PostgreSQL itself: their server sessions
        are theirs alone, and what they set stays with them."""
        return self.report().pooling is Pooling.DIRECT


def prepare_as_decided(engine: sa.Engine, asked: PrepareThreshold, probe: PathProbe) -> None:
    """Give every new connection of ``engine`` the threshold :func:`decide_prepare_threshold`
    picks, asking ``probe`` (once) what sits in front of PostgreSQL when that matters."""
    decided: list[int | None] = []
    lock = threading.Lock()

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with lock:
            if not decided:
                decided.append(decide_prepare_threshold(asked, lambda: probe.report().pooling))
        dbapi_conn.prepare_threshold = decided[0]
