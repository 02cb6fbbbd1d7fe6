"""``durable-tasks doctor``: what in this deployment would lose or duplicate work.

Facts are gathered from the real servers by :func:`gather_facts`; every check is a pure
function of those facts, so each can be tested on its own and all of them against a server
configured badly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from redis.exceptions import ResponseError
from sqlalchemy.exc import SQLAlchemyError

from .migrations import SchemaReport, schema_report
from .migrations.schema import is_extra, is_storage
from .readmodel.tasks import oldest_final
from .settings import Settings
from .store import DatabaseProblem
from .store.pooler import Pooling, PoolingReport
from .transport.keys import CONSUMER_GROUP
from .urls import safe_url

if TYPE_CHECKING:
    from .app import App

__all__ = ["MIN_REDIS_VERSION", "Facts", "Finding", "Level", "diagnose", "gather_facts"]

#: XAUTOCLAIM's deleted-id reply, XINFO lag and Lua semantics we rely on arrived in 7.0.
MIN_REDIS_VERSION = (7, 0, 0)
MAX_CLOCK_SKEW = timedelta(seconds=2)
#: How far past DT_RETENTION the oldest final task may be before doctor warns: a reaper that
#: keeps up prunes every DT_REAPER_INTERVAL, so it is seconds past it, never an hour.
RETENTION_SLACK = timedelta(hours=1)


class Level(Enum):
    """How bad a finding is; errors make doctor exit non-zero."""

    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict and what to do about it."""

    level: Level
    check: str
    message: str


@dataclass(slots=True)
class Facts:
    """What the servers and settings say."""

    settings: Settings
    redis_info: dict[str, Any]
    redis_config: dict[str, str]
    host_now: datetime
    redis_now: datetime
    database_now: datetime | None
    groups_missing: list[str] = field(default_factory=list)
    task_timeouts: dict[str, timedelta] = field(default_factory=dict)
    streams_untrimmed: dict[str, int] = field(default_factory=dict)
    #: CREATE INDEX statements for the runtime's indexes the database lacks.
    indexes_missing: list[str] = field(default_factory=list)
    #: What sits between the runtime and PostgreSQL (None: not PostgreSQL).
    pooling: PoolingReport | None = None
    #: Whether a test NOTIFY sent through the application's URL reached a LISTEN on the
    #: listener's URL (None: the database has no NOTIFY).
    listen_reaches: bool | None = None
    #: Settings of the database server that can lose or duplicate work (the store knows which).
    database_problems: list[DatabaseProblem] = field(default_factory=list)
    #: The schema's version and drift (None: not read).
    schema: SchemaReport | None = None
    #: Per queue, outbox rows held because a dispatcher does not register their task's name.
    unknown_held: dict[str, int] = field(default_factory=dict)
    #: When the oldest final task finished (None: none, or the tables cannot be read).
    oldest_final: datetime | None = None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def check_eviction(f: Facts) -> Finding:
    """Eviction would silently drop stream entries and dedup keys."""
    policy = f.redis_config.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        return Finding(
            Level.ERROR,
            "maxmemory-policy",
            f"maxmemory-policy is {policy}: Redis may evict stream entries and dedup keys under memory "
            "pressure. Set it to noeviction (CONFIG SET maxmemory-policy noeviction).",
        )
    return Finding(Level.OK, "maxmemory-policy", "noeviction")


def check_persistence(f: Facts) -> Finding:
    """Without persistence a restart empties Redis; the reconciler then redispatches."""
    aof = f.redis_config.get("appendonly", "no") == "yes"
    rdb = bool(f.redis_config.get("save", "").strip())
    if not aof and not rdb:
        return Finding(
            Level.WARNING,
            "persistence",
            "Redis persists nothing: a restart loses every stream entry. No task is lost (the database "
            "re-drives them) but each in-flight task runs again. Enable AOF (appendonly yes).",
        )
    return Finding(Level.OK, "persistence", "AOF" if aof else "RDB snapshots only")


def check_version(f: Facts) -> Finding:
    """Below the floor, XAUTOCLAIM and stream semantics differ from what the runtime expects."""
    version = str(f.redis_info.get("valkey_version") or f.redis_info.get("redis_version", "0"))
    if _version(version) < MIN_REDIS_VERSION:
        floor = ".".join(map(str, MIN_REDIS_VERSION))
        return Finding(
            Level.ERROR, "version", f"server version {version} is below the supported floor {floor}; upgrade."
        )
    return Finding(Level.OK, "version", version)


def check_groups(f: Facts) -> Finding:
    """A stream without its group is read by nobody until a worker starts."""
    if f.groups_missing:
        return Finding(
            Level.WARNING,
            "consumer-group",
            f"no consumer group on {', '.join(f.groups_missing)}: no worker has started for it yet "
            "(it is created from 0-0 on start, so nothing already queued is lost).",
        )
    return Finding(Level.OK, "consumer-group", "present on every stream")


def check_clock_skew(f: Facts) -> Finding:
    """Leases compare clocks: skew makes a lease expire early (duplicates) or late (slow recovery)."""
    skews = {"redis": abs(f.redis_now - f.host_now)}
    if f.database_now is not None:
        skews["database"] = abs(f.database_now - f.host_now)
    worst, skew = max(skews.items(), key=lambda kv: kv[1])
    if skew > MAX_CLOCK_SKEW:
        return Finding(
            Level.ERROR,
            "clock-skew",
            f"this host's clock is {skew.total_seconds():.1f} s off the {worst} server's (bound "
            f"{MAX_CLOCK_SKEW.total_seconds():.0f} s): leases would expire early or late. Run NTP.",
        )
    return Finding(Level.OK, "clock-skew", f"within {skew.total_seconds():.3f} s")


def check_timeouts(f: Facts) -> Finding:
    """A task allowed to run longer than the visibility timeout could be dead-lettered alive."""
    s = f.settings
    too_long = {name: t for name, t in f.task_timeouts.items() if t >= s.visibility_timeout}
    if too_long:
        names = ", ".join(sorted(too_long))
        return Finding(
            Level.ERROR,
            "timeouts",
            f"task timeout of {names} is not shorter than visibility_timeout ({s.visibility_timeout}); "
            "raise DT_VISIBILITY_TIMEOUT or shorten the task timeout.",
        )
    return Finding(Level.OK, "timeouts", "every task timeout is below the visibility timeout")


def check_dedup_ttl(f: Facts) -> Finding:
    """A dedup key must outlive any redispatch of the same delivery."""
    s = f.settings
    window = max(s.backoff_max, s.retry_backoff_max) + s.claim_lease + s.visibility_timeout
    if s.dedup_ttl <= window:
        return Finding(
            Level.ERROR,
            "dedup-ttl",
            f"dedup_ttl ({s.dedup_ttl}) is not longer than the redispatch window ({window}): a republished "
            "delivery could be added twice. Raise DT_DEDUP_TTL.",
        )
    return Finding(Level.OK, "dedup-ttl", f"{s.dedup_ttl} > redispatch window {window}")


def check_trimming(f: Facts) -> Finding:
    """Streams grow until a reaper trims them (MINID below the oldest pending entry)."""
    if f.streams_untrimmed:
        sizes = ", ".join(f"{k}: {v}" for k, v in f.streams_untrimmed.items())
        return Finding(
            Level.WARNING,
            "trimming",
            f"streams hold many acknowledged entries ({sizes}); run a reaper, which trims below the oldest "
            "pending entry. Never trim with MAXLEN: it can drop unacknowledged tasks.",
        )
    return Finding(Level.OK, "trimming", "streams are trimmed")


def check_indexes(f: Facts) -> Finding:
    """A database created by an older version lacks newer indexes: without them the
    dispatcher's claim walks past every SENT row, and operator queries scan whole tables."""
    if f.indexes_missing:
        return Finding(
            Level.WARNING,
            "indexes",
            "the database lacks indexes this version uses; create them: " + "; ".join(f.indexes_missing),
        )
    return Finding(Level.OK, "indexes", "every index of dt_tasks, dt_outbox and dt_attempts exists")


def check_pooler(f: Facts) -> Finding:
    """A pooler in transaction mode hands each transaction to any server connection: what is
    set on a session (LISTEN, SET, prepared statements) does not stay the client's."""
    if f.pooling is None:
        return Finding(Level.OK, "pooler", "not PostgreSQL")
    if f.pooling.pooling is Pooling.TRANSACTION:
        return Finding(
            Level.WARNING if not f.listen_reaches else Level.OK,
            "pooler",
            f"a pooler in transaction mode between durable_tasks and PostgreSQL ({f.pooling.evidence}): every "
            "transaction may run on another server connection, so durable_tasks leaves no setting on one and "
            "prepares no statement through it; NOTIFY cannot reach a dispatcher's LISTEN through it (point "
            "DT_LISTEN_DATABASE_URL at PostgreSQL itself).",
        )
    if f.pooling.pooling is Pooling.SESSION:
        return Finding(Level.OK, "pooler", f"a pooler in session mode ({f.pooling.evidence}): it keeps sessions")
    return Finding(Level.OK, "pooler", f"a direct connection to PostgreSQL ({f.pooling.evidence})")


def check_listen(f: Facts) -> Finding:
    """Without NOTIFY a dispatcher finds new work only when it polls."""
    if f.listen_reaches is None:
        return Finding(Level.OK, "listen", "not PostgreSQL: dispatchers poll")
    interval = f.settings.poll_interval.total_seconds()
    url = safe_url(f.settings.listen_database_url or f.settings.database_url or "")
    if not f.listen_reaches:
        return Finding(
            Level.WARNING,
            "listen",
            f"a test NOTIFY did not reach a LISTEN on {url} within "
            f"{f.settings.listen_check_timeout.total_seconds():.1f} s: dispatchers poll every {interval:.1f} s "
            "instead of waking at each submit. Set DT_LISTEN_DATABASE_URL to a direct connection to PostgreSQL.",
        )
    return Finding(Level.OK, "listen", f"a test NOTIFY reached a LISTEN on {url}: dispatchers wake at each submit")


def check_database(f: Facts) -> Finding:
    """The database server's own settings, as its store judges them (isolation, durability)."""
    if not f.database_problems:
        return Finding(Level.OK, "database", "no risky server setting found")
    level = Level.ERROR if any(p.severe for p in f.database_problems) else Level.WARNING
    return Finding(level, "database", " ".join(f"{p.check}: {p.message}" for p in f.database_problems))


def check_schema(f: Facts) -> Finding:
    """A schema older than the code stops every runtime process; drift from the models (a
    column or index added or dropped by hand, a step applied only in part) breaks or slows
    the statements that rely on it."""
    if f.schema is None:
        return Finding(Level.OK, "schema", "not checked")
    if f.schema.problem is not None:
        return Finding(Level.ERROR, "schema", f.schema.problem)
    # Extra columns or indexes, and storage parameters (a table's speed, not its statements), warn.
    missing = [line for line in f.schema.drift if not (is_extra(line) or is_storage(line))]
    if f.schema.drift:
        return Finding(
            Level.ERROR if missing else Level.WARNING,
            "schema",
            f"{f.schema.status}; the tables differ from this version's models: " + "; ".join(f.schema.drift),
        )
    if f.schema.newer:
        return Finding(Level.WARNING, "schema", f"{f.schema.status}: made by a newer release (compatible)")
    return Finding(Level.OK, "schema", f"{f.schema.status}; no drift")


def check_unknown_tasks(f: Facts) -> Finding:
    """Rows held for a task name no dispatcher registers: a deploy in progress, or a name no code has."""
    if f.unknown_held:
        held = ", ".join(f"{queue}: {n}" for queue, n in sorted(f.unknown_held.items()))
        return Finding(
            Level.WARNING,
            "unknown-tasks",
            f"tasks held PENDING under a name the dispatcher does not register ({held}): deploy the code that "
            f"defines them; they are dead-lettered after unknown_task_grace ({f.settings.unknown_task_grace}).",
        )
    return Finding(Level.OK, "unknown-tasks", "every pending task's name is registered")


def check_retention(f: Facts) -> Finding:
    """With DT_RETENTION set, every reaper pass prunes the final tasks past it: one left far
    past it means that no reaper prunes, or that its prune is slower than tasks finish."""
    s = f.settings
    age = f.host_now - f.oldest_final if f.oldest_final is not None else timedelta(0)
    if s.retention is None:
        return Finding(Level.OK, "retention", f"DT_RETENTION is off; the oldest final task is {_hours(age)} old")
    behind = age - s.retention
    if behind > max(RETENTION_SLACK, 2 * s.reaper_interval):
        return Finding(
            Level.WARNING,
            "retention",
            f"the oldest final task finished {_hours(behind)} past DT_RETENTION ({s.retention}): run a reaper "
            "with DT_RETENTION set; if one runs, its prune is slower than tasks finish: raise "
            f"DT_RETENTION_MIN_RATE ({s.retention_min_rate:g} tasks/s).",
        )
    return Finding(Level.OK, "retention", f"final tasks are pruned {s.retention} after they finish")


def _hours(span: timedelta) -> str:
    return f"{span.total_seconds() / 3600:.1f} h"


CHECKS = (
    check_eviction,
    check_persistence,
    check_version,
    check_groups,
    check_clock_skew,
    check_timeouts,
    check_dedup_ttl,
    check_trimming,
    check_indexes,
    check_pooler,
    check_listen,
    check_database,
    check_schema,
    check_unknown_tasks,
    check_retention,
)


def diagnose(facts: Facts) -> list[Finding]:
    """Every check's finding."""
    return [check(facts) for check in CHECKS]


async def gather_facts(app: App, *, untrimmed_threshold: int = 10_000) -> Facts:
    """Ask the servers (Redis INFO, CONFIG, TIME, streams; the database's clock, indexes and
    settings, through its store)."""
    runtime = app.runtime
    client = runtime.transport().client
    info: dict[str, Any] = await client.info("server")
    config: dict[str, str] = {}
    for key in ("maxmemory-policy", "appendonly", "save"):
        with contextlib.suppress(ResponseError):  # CONFIG disabled by ACL: checks assume the defaults
            reply: dict[Any, Any] = await client.config_get(key)
            config.update({str(k): str(v) for k, v in reply.items()})
    seconds, micros = await client.time()
    host_now = app.clock()
    redis_now = datetime.fromtimestamp(seconds + micros / 1e6, tz=host_now.tzinfo)
    database = await runtime.store.facts()
    missing: list[str] = []
    untrimmed: dict[str, int] = {}
    streams = [stream for q in runtime.queues() for stream, shadow, _ in runtime.transport().streams(q) if not shadow]
    for stream in streams:
        if not await client.exists(stream):
            continue
        groups = await client.xinfo_groups(stream)
        group = next((g for g in groups if str(g["name"]) == CONSUMER_GROUP), None)
        if group is None:
            missing.append(stream)
            continue
        length = int(await client.xlen(stream))
        outstanding = int(group.get("pending") or 0) + int(group.get("lag") or 0)
        if length - outstanding > untrimmed_threshold:
            untrimmed[stream] = length
    timeouts = {t.name: t.timeout for t in runtime.registry.values() if t.timeout is not None}
    unknown_held, oldest = await _read_tables(app)
    return Facts(
        app.settings,
        info,
        config,
        host_now,
        redis_now,
        database.now,
        missing,
        timeouts,
        untrimmed,
        database.indexes_missing,
        database.pooling,
        database.listen_reaches,
        database.problems,
        schema=schema_report(app.engine),
        unknown_held=unknown_held,
        oldest_final=oldest,
    )


async def _read_tables(app: App) -> tuple[dict[str, int], datetime | None]:
    """Per queue, rows held for an unknown task name; and when the oldest final task finished.
    Nothing when the tables cannot be read (the schema check says why)."""
    namespace = app.settings.namespace
    try:
        backlogs = await app.runtime.store.queue_backlogs(namespace)
        oldest = await anyio.to_thread.run_sync(partial(oldest_final, app.runtime.store.read_engine, namespace))
    except SQLAlchemyError:
        return {}, None
    return {queue: b.unknown_held for queue, b in backlogs.items() if b.unknown_held}, oldest
