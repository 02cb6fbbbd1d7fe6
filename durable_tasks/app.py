"""The App: task registry, settings, database and Redis wiring, and the runtime's entry points."""

from __future__ import annotations

import asyncio
import logging
import unicodedata
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import redis.asyncio as aioredis
import sqlalchemy as sa
import tenacity
from anyio import to_thread
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import RedisClusterException, RedisError
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlmodel import SQLModel

from . import codec
from .clock import Clock, system_clock
from .dispatcher import Dispatcher
from .errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DatabaseUnavailableError,
    InvalidIdempotencyKeyError,
    TaskNotFoundError,
    UnknownTaskError,
)
from .notify import OutboxWaiter, waiter_for
from .reaper import Reaper, ReapReport
from .settings import NAME_PATTERN, Settings
from .store import queries, retention
from .store import submit as submit_store
from .store.aio import LoopStore
from .store.engine import create_engine, read_only, runtime_plans
from .store.retention import PruneReport
from .tasks import Task, TaskContext, TaskHandle
from .telemetry import Redactor, Telemetry, traceparent_of
from .transport.streams import RedisStreamsTransport
from .urls import safe_url
from .views import QueueStats, TaskInfo
from .worker import Worker

__all__ = ["App"]

logger = logging.getLogger(__name__)

_MAX_TASK_NAME = 200  # dt_tasks.name

P = TypeVar("P")
R = TypeVar("R")
HandlerT = Callable[[TaskContext[P], P], Any]


class App:
    """One durable task runtime: holds the engine, the Redis client, the registry, settings.

    ``App()`` with no URLs uses a SQLite file and an embedded Valkey in ``data_dir``; every
    argument can also come from ``DT_*`` environment variables.
    """

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        namespace: str | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock = system_clock,
        redact: Redactor | None = None,
        tables: Sequence[type[SQLModel]] = (),
        **overrides: Any,
    ) -> None:
        given = {"database_url": database_url, "redis_url": redis_url, "namespace": namespace, **overrides}
        try:
            base = settings or Settings()
            self.settings = Settings.model_validate(
                base.model_dump() | {k: v for k, v in given.items() if v is not None}
            )
        except ValueError as exc:
            raise ConfigurationError(f"invalid durable_tasks settings: {exc}") from exc
        self.clock = clock
        self.tables = list(tables)
        self.telemetry = Telemetry(self.settings.namespace, trace_payloads=self.settings.trace_payloads, redact=redact)
        self.latest_stats: dict[str, QueueStats] = {}
        self.telemetry.observe_queues(self)
        self.registry: dict[str, Task[Any, Any]] = {}
        self.paused_queues: set[str] = set()
        self._engine: sa.Engine | None = None
        self._runtime_engine: tuple[sa.Engine, sa.Engine] | None = None  # (engine, its runtime_plans view)
        self._redis_url: str | None = self.settings.redis_url
        # The transport of the event loop that made it (redis.asyncio clients are bound to one loop;
        # the loop object, not its id, is kept: a new loop may reuse a dead one's id).
        self._transport: tuple[asyncio.AbstractEventLoop, RedisStreamsTransport] | None = None
        self._store: tuple[asyncio.AbstractEventLoop, LoopStore] | None = None  # the same rule

    # -- declaring tasks -----------------------------------------------------------------

    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: timedelta | None = None,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> Callable[[HandlerT[P]], Task[P, Any]]:
        """Register ``fn(ctx, payload)`` as a task (sync or async).

        ``max_attempts`` counts executions that raise; ``retry_on`` limits which exceptions
        retry (default: all); ``timeout`` bounds one attempt.
        """

        def register(f: HandlerT[P]) -> Task[P, Any]:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if not NAME_PATTERN.fullmatch(queue):
                raise ConfigurationError(f"queue name {queue!r} must match {NAME_PATTERN.pattern}")
            if not 0 < len(task_name) <= _MAX_TASK_NAME:
                raise ConfigurationError(f"task name {task_name[:40]!r}… must be 1-{_MAX_TASK_NAME} characters")
            if task_name in self.registry:
                raise ConfigurationError(
                    f"a task named {task_name!r} is already registered; pass name=... to register this one apart"
                )
            if max_attempts < 1:
                raise ConfigurationError("max_attempts must be at least 1")
            t: Task[P, Any] = Task(
                self, f, name=task_name, queue=queue, max_attempts=max_attempts, timeout=timeout, retry_on=retry_on
            )
            self.registry[task_name] = t
            return t

        return register

    def queues(self) -> list[str]:
        """Every queue a registered task uses."""
        return sorted({t.queue for t in self.registry.values()})

    # -- database ------------------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (created on first use)."""
        if self._engine is None:
            self._engine = create_engine(self.settings.database_url, self.settings.data_dir)
        return self._engine

    @property
    def runtime_engine(self) -> sa.Engine:
        """The same engine and pool, for the runtime's own periodic transactions that run no
        application code (heartbeats, the reaper's reads): on PostgreSQL they plan with
        sequential scans priced out, for that transaction only
        (:func:`.store.engine.runtime_plans`). Transactions that run hooks stay on
        :attr:`engine`: a hook's statements are the application's, planned as it plans them."""
        engine = self.engine
        if self._runtime_engine is None or self._runtime_engine[0] is not engine:
            self._runtime_engine = (engine, runtime_plans(engine))
        return self._runtime_engine[1]

    @property
    def read_engine(self) -> sa.Engine:
        """The engine for read-only work: on SQLite its transactions do not take the write lock."""
        return read_only(self.engine)

    def create_all(self) -> None:
        """Create the runtime's tables (dt_tasks, dt_outbox, dt_attempts, and the dt_agent_*
        tables once durable_tasks.agents is imported) and the application's ``tables``, if
        they do not exist. ``durable-tasks init-db`` calls this."""
        ours = [table for name, table in SQLModel.metadata.tables.items() if name.startswith("dt_")]
        ours += [model.__table__ for model in self.tables]  # type: ignore[attr-defined]
        try:
            SQLModel.metadata.create_all(self.engine, tables=ours)
        except OperationalError as exc:
            raise DatabaseUnavailableError(self._db_hint(exc)) from exc

    def _db_hint(self, exc: BaseException) -> str:
        url = safe_url(self.engine.url.render_as_string(hide_password=False))
        return f"cannot reach the database at {url}: {exc}. Start it, or point DT_DATABASE_URL at one."

    # -- writing intents -----------------------------------------------------------------

    def submit(
        self,
        session: Session,
        task: Task[Any, Any] | str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        shadow: bool = False,
        partition_key: str | None = None,
    ) -> TaskHandle:
        """Record a task intent in ``session``'s transaction; the caller commits.

        ``partition_key`` picks the stream partition of a partitioned queue (tasks with the same
        key stay in one partition, in order); by default the task id spreads them.

        Raises a typed error, writing nothing, for an unknown task, an invalid, non-JSON or
        oversized payload, or a bad idempotency key.
        """
        if isinstance(task, str):
            found = self.registry.get(task)
            if found is None:
                raise UnknownTaskError(f"no task named {task!r}; registered: {sorted(self.registry)}")
            task = found
        s = self.settings
        self._check_idempotency_key(idempotency_key)
        payload_json = codec.encode_payload(
            task.payload_adapter, payload, task=task.name, max_bytes=s.max_payload_bytes, max_depth=s.max_json_depth
        )
        with self.telemetry.submit_span(task.name, task.queue) as span:
            span.set_attributes(self.telemetry.payload_attributes(task.name, "payload", payload_json))
            new = submit_store.NewTask(
                namespace=s.namespace,
                name=task.name,
                queue=task.queue,
                payload_json=payload_json,
                idempotency_key=idempotency_key,
                max_attempts=task.max_attempts,
                traceparent=traceparent_of(span),
                shadow=shadow,
                partition_key=partition_key,
            )
            try:
                outcome = submit_store.submit_task(session, new, self.clock())
            except OperationalError as exc:
                raise DatabaseUnavailableError(self._db_hint(exc)) from exc
            span.set_attributes({"durable_tasks.task.id": outcome.task_id, "durable_tasks.created": outcome.created})
        if outcome.created:
            self.telemetry.submitted.add(1, {"queue": task.queue, "task": task.name})
        return TaskHandle(outcome.task_id, task.name, outcome.generation, outcome.created)

    def _check_idempotency_key(self, key: str | None) -> None:
        if key is None:
            return
        limit = self.settings.max_idempotency_key_length
        if not key.strip():
            raise InvalidIdempotencyKeyError("idempotency_key is empty; pass None or a stable request id")
        if len(key) > limit:
            raise InvalidIdempotencyKeyError(f"idempotency_key is {len(key)} characters, over {limit}; hash it")
        if any(unicodedata.category(c) == "Cc" for c in key):
            raise InvalidIdempotencyKeyError("idempotency_key contains control characters; strip or hash it")

    def rerun(self, session: Session, task_id: str) -> int:
        """Start a new generation (rejudge, retry-from-here) in ``session``'s transaction.

        Returns the new generation; executions of older generations are fenced out.
        """
        generation = submit_store.rerun_task(session, self.settings.namespace, task_id, self.clock())
        if generation is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return generation

    def cancel(self, session: Session, task_id: str) -> bool:
        """Cancel a task in ``session``'s transaction; False if it already has a final state.

        A running attempt keeps running but its result is fenced out.
        """
        cancelled = submit_store.cancel_task(session, self.settings.namespace, task_id, self.clock())
        if cancelled is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return cancelled

    def get_task(self, task_id: str) -> TaskInfo:
        """The task's state, generation, attempt, result, error and attempts history."""
        loaded = queries.load_task(self.read_engine, self.settings.namespace, task_id)
        if loaded is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return TaskInfo.from_records(*loaded)

    def prune(self, older_than: timedelta, *, batch: int = 1000, max_batches: int = 1000) -> PruneReport:
        """Delete sent outbox rows and final tasks (with attempts) older than ``older_than``,
        ``batch`` rows per transaction. Pending work is never touched."""
        return retention.prune(
            self.engine, self.settings.namespace, before=self.clock() - older_than, batch=batch, max_batches=max_batches
        )

    # -- Redis ---------------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        """The Redis URL in use (starting the embedded Valkey if none was given)."""
        if self._redis_url is None:
            from .embedded import ensure_valkey

            self._redis_url = ensure_valkey(self.settings.data_dir)
        return self._redis_url

    def transport(self) -> RedisStreamsTransport:
        """The Redis Streams transport for the running event loop."""
        loop = asyncio.get_running_loop()
        if self._transport is not None and self._transport[0] is loop:
            return self._transport[1]
        url, cluster = self.redis_url, self.settings.redis_cluster
        if url.startswith("redis+cluster://") or url.startswith("rediss+cluster://"):
            url, cluster = url.replace("+cluster", "", 1), True
        # Undecodable bytes in an entry must not break every read: they become U+FFFD, the
        # entry is then malformed, and it goes to the DLQ.
        client: aioredis.Redis | aioredis.RedisCluster = (
            _cluster_client(url)
            if cluster
            else aioredis.Redis.from_url(url, decode_responses=True, encoding_errors="replace")
        )
        found = RedisStreamsTransport(
            client,
            self.settings.namespace,
            dedup_ttl=self.settings.dedup_ttl,
            partitions=self.settings.queue_partitions,
            signing_key=key.get_secret_value().encode() if (key := self.settings.signing_key) else None,
        )
        self._transport = (loop, found)  # one loop at a time; a finished loop's client is dropped
        return found

    def store(self) -> LoopStore:
        """The dispatcher's and worker's hot database paths, for the running event loop."""
        loop = asyncio.get_running_loop()
        if self._store is not None and self._store[0] is loop:
            return self._store[1]
        if self._store is not None:  # a finished loop's connections: closing does not wait on the server
            self._store[1].close()
        found = LoopStore(self.engine)
        self._store = (loop, found)
        return found

    def transport_for(self, queue: str) -> RedisStreamsTransport | None:
        """The transport serving ``queue``, or None while the queue is paused."""
        return None if queue in self.paused_queues else self.transport()

    def outbox_waiter(self) -> OutboxWaiter:
        """How the dispatcher waits between passes (NOTIFY on Postgres)."""
        s = self.settings
        return waiter_for(
            self.engine, s.namespace, listen_url=s.listen_database_url, check_timeout=s.listen_check_timeout
        )

    async def check_connections(self, *, wait: timedelta = timedelta(0)) -> None:
        """Raise DatabaseUnavailableError / BrokerUnavailableError if either cannot be reached.

        With ``wait``, keep trying for that long first (backing off up to 2 s, logging each
        failure): a process started during a Redis Cluster failover or before its servers are
        up then starts when they are, instead of exiting and waiting for its supervisor.
        """
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type((DatabaseUnavailableError, BrokerUnavailableError)),
            stop=tenacity.stop_after_delay(wait.total_seconds()),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2),
            before_sleep=lambda state: logger.warning(
                "%s; retrying for up to %s", state.outcome.exception() if state.outcome else "?", wait
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._check_connections_once()

    async def _check_connections_once(self) -> None:
        try:
            await to_thread.run_sync(lambda: self.engine.connect().close())
        except SQLAlchemyError as exc:
            raise DatabaseUnavailableError(self._db_hint(exc)) from exc
        try:
            await self.transport().client.ping()
        except (RedisError, RedisClusterException, OSError) as exc:
            raise BrokerUnavailableError(
                f"cannot reach Redis at {safe_url(self.redis_url)}: {exc}. Start it, or point DT_REDIS_URL at one."
            ) from exc

    def stop_embedded(self) -> bool:
        """Stop the embedded Valkey this process started (no-op with a configured Redis URL)."""
        if self.settings.redis_url is not None:
            return False
        from .embedded import stop_valkey

        return stop_valkey(self.settings.data_dir)

    async def aclose(self) -> None:
        """Close the Redis client of this event loop, the loops' database connections, and the
        engine's pool."""
        held, self._transport = self._transport, None
        if held is not None and held[0] is asyncio.get_running_loop():
            await held[1].client.aclose()  # a finished loop's client cannot be closed from this one
        store, self._store = self._store, None
        if store is not None:
            store[1].close()
        if self._engine is not None:
            self._engine.dispose()

    # -- running -------------------------------------------------------------------------

    async def dispatch_once(self) -> int:
        """One dispatcher pass; returns how many outbox rows it handled (0 when none were due)."""
        return await Dispatcher(self).dispatch_once()

    async def work(
        self, max_tasks: int | None = None, timeout: timedelta | float | None = None, *, queues: list[str] | None = None
    ) -> int:
        """Run a worker until ``max_tasks`` deliveries are settled or ``timeout`` passes."""
        if isinstance(timeout, int | float):
            timeout = timedelta(seconds=timeout)
        return await Worker(self, queues=queues).run(max_tasks=max_tasks, timeout=timeout)

    async def reap_once(self) -> ReapReport:
        """One reaper pass (reclaim, dead-letter, reconcile, trim)."""
        return await Reaper(self).reap_once()

    async def stats(self) -> dict[str, QueueStats]:
        """Per queue: outbox backlog and oldest age, PEL size, queue delay, oldest pending age,
        DLQ length."""
        now = self.clock()
        backlogs = await to_thread.run_sync(lambda: queries.queue_backlogs(self.read_engine, self.settings.namespace))
        out: dict[str, QueueStats] = {}
        for queue in sorted(set(self.queues()) | set(backlogs)):
            b = backlogs.get(queue)
            snap = await self.transport().snapshot(queue, now_ms=int(now.timestamp() * 1000))
            out[queue] = QueueStats(
                outbox_backlog=b.outbox_backlog if b else 0,
                outbox_oldest_age_s=(now - b.outbox_oldest).total_seconds() if b and b.outbox_oldest else 0.0,
                pel_size=snap.pel_size,
                queue_delay_s=(now - b.oldest_enqueued).total_seconds() if b and b.oldest_enqueued else 0.0,
                oldest_pending_age_s=snap.oldest_pending_age_s,
                dlq_length=snap.dlq_length,
                stream_lag=snap.stream_lag,
            )
        self.latest_stats = out
        return out

    async def run(
        self,
        *,
        dispatcher: bool = True,
        worker: bool = True,
        reaper: bool = True,
        queues: list[str] | None = None,
        stop: anyio.Event | None = None,
    ) -> None:
        """Run the chosen components until ``stop`` is set (or cancellation).

        On ``stop`` the worker stops reading and gives in-flight tasks ``shutdown_grace`` to
        finish (whatever is left stays pending for a reaper); then the dispatcher and reaper end.
        """
        await self.check_connections(wait=self.settings.startup_wait)
        w = Worker(self, queues=queues) if worker else None
        async with anyio.create_task_group() as tg:
            if dispatcher:
                tg.start_soon(Dispatcher(self).run)
            if reaper:
                tg.start_soon(Reaper(self).run)
            if w is not None:

                async def work_then_stop_all() -> None:
                    await w.run()
                    tg.cancel_scope.cancel()

                tg.start_soon(work_then_stop_all)
            if stop is not None:
                await stop.wait()
                if w is not None:
                    w.stop()
                else:
                    tg.cancel_scope.cancel()


def _cluster_client(url: str) -> aioredis.RedisCluster:
    """A cluster client; ``redis://h1:p1,h2:p2/0`` names several seed nodes, so the loss of
    one of them does not stop a (re)connect. Everything else in the URL (credentials,
    ``rediss`` and its ``ssl_*`` options) applies to every node."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    seeds = []
    for hostport in hosts.split(","):
        host, _, port = hostport.rpartition(":")
        seeds.append(ClusterNode(host or "127.0.0.1", int(port or 6379)))
    # The URL with its first seed alone: redis-py parses it as for one node (TLS options
    # included), and the other seeds join as startup nodes.
    first = f"{scheme}://{userinfo + '@' if userinfo else ''}{hosts.split(',')[0]}{slash}{path}"
    return aioredis.RedisCluster.from_url(
        first, startup_nodes=seeds[1:], decode_responses=True, encoding_errors="replace"
    )
