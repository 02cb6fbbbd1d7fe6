"""Every tunable of the runtime, with its default, in one pydantic settings model.

Each field reads from an environment variable ``DT_<FIELD>`` (e.g. ``DT_BATCH_SIZE=100``,
``DT_POLL_INTERVAL=0.5``). Durations are ``timedelta`` (seconds or ISO 8601 in the environment).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, TypeGuard
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "NAME_PATTERN",
    "Duration",
    "PrepareThreshold",
    "Settings",
    "SettingsOverrides",
    "parse_prepare_threshold",
    "printable_text",
]

#: Namespaces and queue names end up inside Redis keys and hash tags: no braces, colons or spaces.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def printable_text(value: object, max_chars: int) -> TypeGuard[str]:
    """Whether ``value`` is a string of 1 to ``max_chars`` printable characters: what a name,
    key or id given at run time may be (task, signal and limit names, concurrency and partition
    keys, task ids). ``isprintable()`` is False for control characters (NUL too), which
    PostgreSQL refuses in text, and for lone surrogates, which UTF-8 cannot hold."""
    return isinstance(value, str) and 0 < len(value) <= max_chars and value.isprintable()


#: ``postgres://`` and ``postgres+driver://``, which SQLAlchemy does not read as PostgreSQL.
_POSTGRES_SCHEME = re.compile(r"^postgres(\+[A-Za-z0-9_]+)?://")


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_WITH_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def _seconds(value: Any) -> Any:
    """Environment variables arrive as text: "2.5" means seconds, like the number 2.5; "7d",
    "12h", "30m", "45s" and "500ms" carry their unit."""
    if isinstance(value, str):
        if unit := _WITH_UNIT.match(value.lower()):
            return float(unit[1]) * _UNIT_SECONDS[unit[2]]
        try:
            return float(value)
        except ValueError:
            return value  # ISO 8601 ("PT2S") or HH:MM:SS: pydantic parses those
    return value


def _off_or_seconds(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() in _NEVER else _seconds(value)


#: A duration: a timedelta, a number of seconds, text with a unit ("7d"), or ISO 8601 text.
Duration = Annotated[timedelta, BeforeValidator(_seconds)]
#: A duration, or none at all ("off").
OptionalDuration = Annotated[timedelta | None, BeforeValidator(_off_or_seconds)]

_NEVER = frozenset({"off", "none", "null", ""})


def parse_prepare_threshold(value: Any) -> Any:
    """psycopg's ``prepare_threshold`` as text allows it (an environment variable, a URL query):
    ``off``/``none`` (never prepare, psycopg's None), ``auto``, or a whole number of executions
    before a statement is prepared (psycopg's meaning: 0 prepares at the first)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _NEVER:
            return None
        if text == "auto":
            return text
        if text.isdigit():
            return int(text)
        raise ValueError(f"prepare_threshold must be a whole number, 'off' or 'auto', not {value!r}")
    return value


#: psycopg's prepare_threshold, or ``auto``: psycopg's default (5) on a direct connection, and
#: off behind a pooler in transaction mode (whatever is asked, since preparing cannot work there).
PrepareThreshold = Annotated[
    Annotated[int, Field(ge=0)] | Literal["auto"] | None, BeforeValidator(parse_prepare_threshold)
]


class Settings(BaseSettings):
    """Runtime settings; every default of DESIGN.md is a field here."""

    # A rejected value is not repeated in the error: URLs and keys may hold secrets.
    model_config = SettingsConfigDict(env_prefix="DT_", extra="forbid", hide_input_in_errors=True)

    database_url: str | None = Field(default=None, description="SQLAlchemy URL; None means a SQLite file in data_dir.")
    redis_url: str | None = Field(
        default=None, description="Redis/Valkey URL; None starts an embedded Valkey in data_dir."
    )
    namespace: str = Field(default="default", description="Prefix of every record and key.")
    redis_cluster: bool = Field(default=False, description="Talk to a Redis Cluster (or redis+cluster:// URL).")
    queue_partitions: dict[str, int] = Field(
        default_factory=dict, description="Queues split into N stream partitions (spread over cluster nodes)."
    )
    listen_database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL of the dispatcher's LISTEN connection; None: database_url. Behind a pooler "
        "in transaction mode NOTIFY does not reach a listener: point this at PostgreSQL directly.",
    )
    prepare_threshold: PrepareThreshold = Field(
        default="auto",
        description="Executions of a statement on one connection before psycopg prepares it (off: never; "
        "also read from the database URL's ?prepare_threshold=); auto: psycopg's default, and off behind a "
        "pooler in transaction mode, where preparing is always off.",
    )
    data_dir: Path = Field(
        default=Path(".durable_tasks"),
        description="Home of the embedded default's SQLite file and Valkey. Unset: .durable_tasks beside the "
        "module that builds the App (whatever directory a process starts in); a relative path is read from the "
        "working directory when the App is built. The App holds it absolute.",
    )

    # dispatcher
    # A pass takes what is due, up to this: idle or busy, no extra latency. Two passes in flight
    # hold at most 2 x batch_size payloads (each <= max_payload_bytes) in a dispatcher.
    batch_size: int = Field(default=500, ge=1, le=10_000, description="Outbox rows per dispatch pass.")
    poll_interval: Duration = timedelta(seconds=2)
    claim_lease: Duration = timedelta(seconds=30)
    backoff_initial: Duration = timedelta(seconds=1)
    backoff_max: Duration = timedelta(seconds=60)
    backoff_jitter: Duration = timedelta(seconds=1)
    listen_check_timeout: Duration = Field(
        default=timedelta(seconds=2),
        description="How long a dispatcher's new LISTEN connection waits for its own test NOTIFY before it "
        "says NOTIFY does not reach it and polls instead.",
    )
    cutover_watermark: int | None = Field(
        default=None, description="Outbox ids below this belong to a legacy path: never sent."
    )
    unknown_task_grace: Duration = Field(
        default=timedelta(hours=1),
        description="How long a task whose name this process does not register is held PENDING (a rolling "
        "deploy: the producer runs newer code) before the dispatcher dead-letters it.",
    )
    publish_on_commit: bool = Field(
        default=True,
        description="A submitting process publishes its new due tasks to Redis once its transaction commits, "
        "ahead of the dispatcher, which still publishes every row (the same dedup key: nothing is added twice); "
        "a worker does the same for the deliveries its own commits create (a suspension's child tasks, "
        "a parent's resume).",
    )
    dedup_ttl: Duration = timedelta(hours=24)
    signing_key: SecretStr | None = Field(
        default=None, description="HMAC key: workers run only stream entries signed with it."
    )

    # worker
    concurrency: int = Field(
        default=1000,
        ge=1,
        le=10_000,
        description="Tasks one worker runs at once (a task waiting for its group commit holds a slot); sync "
        "handlers get threads only as they block, up to this many (or handler_threads). 1,000: measured at or "
        "ahead of smaller settings for no-op and async handlers (docs/performance.md); sync handlers that block "
        "briefly do better with handler_threads=512 than with fewer slots, and handlers that each need a core "
        "(a sandbox) want it at the cores this worker may use.",
    )
    handler_threads: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Threads one worker runs sync handlers on, at most (None: its concurrency); they start only "
        "as handlers block, and a sync task beyond them waits for one, holding its slot and lease (the wait "
        "counts against its timeout: past it, the handler never starts). 512 under "
        "the default concurrency drained handlers that block 50 ms 15-25 % faster than 1,000 threads; "
        "handlers that block longer than about 0.2 s want a thread per slot: threads / seconds blocked caps "
        "their rate (docs/performance.md).",
    )
    heartbeat_interval: Duration = timedelta(seconds=5)
    lease_timeout: Duration = timedelta(seconds=10)
    read_block: Duration = timedelta(seconds=1)
    retry_backoff_initial: Duration = timedelta(seconds=1)
    retry_backoff_max: Duration = timedelta(seconds=60)
    shutdown_grace: Duration = timedelta(seconds=30)
    startup_wait: Duration = Field(
        default=timedelta(seconds=30),
        description="How long a starting dispatcher, worker or reaper keeps retrying an unreachable "
        "Postgres or Redis (a failover, a server still starting) before it gives up; 0 gives up at once.",
    )
    payload_memory: int = Field(
        default=128 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes of payloads over 64 KiB that one worker holds at once; an attempt whose payload does "
        "not fit waits (its lease kept) for running ones to end, and one larger than this runs alone. While its "
        "task runs a payload costs its decoded value (its text is dropped once decoded).",
    )
    commit_batch_max: int = Field(default=512, ge=1, description="Results per group-commit transaction.")
    commit_window: Duration = Field(default=timedelta(0), description="Extra wait to fill a group commit.")

    # the processes the CLI starts (run, worker, dispatcher, reaper); see durable_tasks.process
    gc_young_threshold: int = Field(
        default=5_000,
        ge=0,
        description="Net allocations between young-generation garbage collections in the processes the "
        "CLI starts, which also freeze what startup left (Python's default: 700); 0 leaves the collector alone.",
    )

    # reaper
    reaper_interval: Duration = timedelta(seconds=10)
    visibility_timeout: Duration = timedelta(minutes=30)
    max_deliveries: int = Field(default=5, ge=1)
    reaper_batch: int = Field(
        default=500,
        ge=1,
        description="Pending entries per page of a reaper pass (one read, one transaction for the lost ones), "
        "and candidates per page of the reconciler.",
    )
    reconcile_grace: Duration = timedelta(seconds=30)
    retention: OptionalDuration = Field(
        default=None,
        description="Finished tasks (with their attempts and outbox rows) older than this are deleted by the "
        "reaper, as `durable-tasks prune` does, e.g. 7d; off (the default) keeps them until a prune.",
    )
    retention_min_rate: float = Field(
        default=2000.0,
        ge=0,
        description="Tasks a second below which a paced prune (the reaper's, `durable-tasks prune`) never slows "
        "itself to leave the workers their share: it keeps up with an intake this fast where the database "
        "deletes slowly; 0 paces by share of time alone.",
    )

    # scheduler (periodic tasks)
    scheduler_grace: Duration = Field(
        default=timedelta(seconds=30),
        description="A tick at most this old is on time and always submitted; older ones were missed "
        "and follow the schedule's catch_up policy.",
    )
    scheduler_refresh: Duration = Field(
        default=timedelta(seconds=5),
        description="A scheduler re-reads dt_schedules at least this often (pauses, resumes, new schedules).",
    )

    # waiting for results
    result_poll_initial: Duration = Field(
        default=timedelta(seconds=2),
        description="A result wait that has heard nothing reads its task after this long, then backs off.",
    )
    result_poll_max: Duration = Field(
        default=timedelta(seconds=30), description="The longest gap between two fallback reads of a result wait."
    )
    result_inline_bytes: int = Field(
        default=4096,
        ge=0,
        description="Results (or error messages) up to this many characters travel in the announcement "
        "that wakes result waits; larger ones are read from the database.",
    )

    # observability
    trace_payloads: bool = Field(
        default=False, description="Put payloads and results on spans (through App(redact=...))."
    )

    # input limits
    max_payload_bytes: int = Field(default=1024 * 1024, ge=64)
    max_json_depth: int = Field(default=64, ge=2)
    max_idempotency_key_length: int = Field(default=512, ge=8, le=512)  # dt_tasks.idempotency_key

    @field_validator("database_url", "listen_database_url")
    @classmethod
    def _postgres_scheme_is_postgresql(cls, value: str | None) -> str | None:
        # Heroku, Render, Supabase and libpq write postgres://; SQLAlchemy knows only postgresql.
        if value is not None and _POSTGRES_SCHEME.match(value):
            return "postgresql" + value[len("postgres") :]
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_port_is_a_number(cls, value: str | None) -> str | None:
        # Checked here, not at the first connection: a malformed port was a traceback there.
        # The message never repeats the URL (it may hold a password).
        if value is not None:
            hosts = urlsplit(value).netloc.rpartition("@")[2]  # a cluster's seeds: host:port,host:port
            try:
                for seed in hosts.split(","):
                    _ = urlsplit(f"//{seed}").port  # urllib checks the port when it is read
            except ValueError:
                raise ValueError("redis_url's port is not a number from 0 to 65535") from None
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace_fits_key_layout(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(
                "namespace must be 1-64 characters of letters, digits, '_', '.', '-' "
                "(it becomes part of Redis keys and hash tags)"
            )
        return value

    @field_validator("queue_partitions")
    @classmethod
    def _partitions_in_range(cls, value: dict[str, int]) -> dict[str, int]:
        for queue, count in value.items():
            if not NAME_PATTERN.fullmatch(queue) or not 1 <= count <= 1024:
                raise ValueError(f"queue_partitions[{queue!r}] must name a valid queue with 1-1024 partitions")
        return value

    @field_validator("dedup_ttl")
    @classmethod
    def _dedup_ttl_at_least_a_day(cls, value: timedelta) -> timedelta:
        if value < timedelta(hours=24):
            raise ValueError("dedup_ttl must be at least 24 hours (longer than any redispatch)")
        return value

    @model_validator(mode="after")
    def _lease_outlives_heartbeat(self) -> Settings:
        if self.lease_timeout <= self.heartbeat_interval:
            raise ValueError("lease_timeout must be longer than heartbeat_interval")
        return self


class SettingsOverrides(TypedDict, total=False):
    """The fields of :class:`Settings` as keyword arguments of ``App(...)`` (all optional), so
    a misspelt or mistyped setting fails the type check. ``database_url``, ``redis_url`` and
    ``namespace`` are ``App``'s positional parameters. Kept equal to Settings' fields by
    ``tests/unit/test_settings_overrides.py``. Durations are timedeltas (the environment
    variables also take seconds)."""

    redis_cluster: bool
    queue_partitions: dict[str, int]
    listen_database_url: str | None
    prepare_threshold: int | Literal["auto", "off"] | None
    data_dir: Path | str
    batch_size: int
    poll_interval: timedelta
    claim_lease: timedelta
    backoff_initial: timedelta
    backoff_max: timedelta
    backoff_jitter: timedelta
    listen_check_timeout: timedelta
    cutover_watermark: int | None
    unknown_task_grace: timedelta
    publish_on_commit: bool
    dedup_ttl: timedelta
    signing_key: SecretStr | str | None
    concurrency: int
    handler_threads: int | None
    heartbeat_interval: timedelta
    lease_timeout: timedelta
    read_block: timedelta
    retry_backoff_initial: timedelta
    retry_backoff_max: timedelta
    shutdown_grace: timedelta
    startup_wait: timedelta
    payload_memory: int
    commit_batch_max: int
    commit_window: timedelta
    gc_young_threshold: int
    reaper_interval: timedelta
    visibility_timeout: timedelta
    max_deliveries: int
    reaper_batch: int
    reconcile_grace: timedelta
    retention: timedelta | None
    retention_min_rate: float
    scheduler_grace: timedelta
    scheduler_refresh: timedelta
    result_poll_initial: timedelta
    result_poll_max: timedelta
    result_inline_bytes: int
    trace_payloads: bool
    max_payload_bytes: int
    max_json_depth: int
    max_idempotency_key_length: int
