"""What the loops run on: the :class:`Runtime` an App builds and hands to its dispatcher,
workers and reaper.

The loops never see the App. They get settings, a clock, telemetry, a read-only view of the
task registry, the store (:class:`~durable_tasks.store.Store`), a transport for the running
event loop, and the set of paused queues. A loop can therefore be built and tested from a
Runtime alone, and nothing below the App imports it.

Concurrency model: the runtime runs on asyncio (anyio's asyncio backend; trio is not
supported, because redis.asyncio and psycopg's async connections are asyncio's). Structure
and synchronization use anyio's primitives (task groups, cancel scopes, Events, Locks,
Semaphores, CapacityLimiter, ``to_thread``). Blocking database work runs in anyio's worker
threads; async clients (Redis, the PostgreSQL store's own connections) are bound to the event
loop that made them and are kept per loop (:class:`~durable_tasks.loopbound.LoopBound`). The
one place that starts raw asyncio tasks is the worker's per-task spawning, where an anyio task
group costs several times more per task (see ``Worker._background``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from .clock import Clock
from .commit_publish import CommitPublisher
from .flow.gate import FlowGate
from .loopbound import LoopBound
from .settings import Settings
from .store import Store
from .store.base import SqlStore
from .store.notify import OutboxWaiter
from .store.outbox import ClaimedDelivery, NewDelivery
from .store.submit import NewTask, SubmitOutcome
from .tasks import Task
from .telemetry import Telemetry
from .transport.connect import close_stale, open_transport
from .transport.enqueue import outgoing
from .transport.keys import wake_channel
from .transport.messages import OutgoingMessage
from .transport.streams import RedisStreamsTransport
from .views import QueueStats
from .wakeup import RedisWakeWaiter

__all__ = ["Runtime", "delivery_message"]

logger = logging.getLogger(__name__)


def delivery_message(d: ClaimedDelivery | NewDelivery, partitions: Mapping[str, int]) -> OutgoingMessage:
    """The stream entry of a delivery the database holds: one the dispatcher leased, or one the
    runtime just wrote (:mod:`.transport.enqueue` makes both publishers send the same)."""
    return outgoing(
        queue=d.queue,
        task_id=d.task_id,
        generation=d.generation,
        delivery=d.delivery,
        name=d.name,
        traceparent=d.traceparent,
        shadow=d.shadow,
        partition_key=d.partition_key,
        partitions=partitions,
        priority=d.priority,
        concurrency_key=d.concurrency_key,
    )


async def _close_transport(transport: RedisStreamsTransport) -> None:
    await transport.client.aclose()


async def _keep_open(transport: RedisStreamsTransport) -> None:
    """A substituted transport outlives the event loops that use it."""


class Runtime:
    """Settings, clock, telemetry, the registry, the store and the transport of one App."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock,
        telemetry: Telemetry,
        registry: Mapping[str, Task[Any, Any]],
        open_store: Callable[[], Store],
        redis_url: Callable[[], str],
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.telemetry = telemetry
        #: The App's tasks by name (read-only: tasks are registered on the App).
        self.registry = registry
        #: Queues the dispatcher holds back: their rows stay PENDING (not an error).
        self.paused_queues: set[str] = set()
        #: Per-queue statistics of the last :func:`durable_tasks.stats.queue_stats` (the gauges read them).
        self.latest_stats: dict[str, QueueStats] = {}
        #: Whether result waits subscribe to the announcements on Redis (False while
        #: :meth:`substituted` runs without Redis: they then read the database alone).
        self.subscribes_to_results = True
        self._open_store = open_store
        self._prioritized: set[str] = set()
        self._prioritized_at = -1
        #: Flow control's admission (rate and concurrency limits) before a worker's claim.
        self.flow = FlowGate(self)
        self._store: Store | None = None
        #: What a committed submit publishes on Redis: its tasks' entries, and the dispatchers'
        #: wake-up where the database has no notification.
        self.wakeups = CommitPublisher(settings, self.prioritized)
        self._transports: LoopBound[RedisStreamsTransport] = LoopBound(
            lambda: self._open_transport(redis_url()), close_stale=close_stale, aclose=_close_transport
        )
        telemetry.observe_queues(self)

    def _open_transport(self, url: str) -> RedisStreamsTransport:
        transport = open_transport(url, self.settings)
        transport.prioritized = self.prioritized
        return transport

    def prioritized(self, queue: str) -> bool:
        """Whether ``queue`` has priority levels: one of its tasks declares ``priority=``
        (durable_tasks.flow); the others keep their queue's one stream."""
        if self._prioritized_at != len(self.registry):  # tasks registered since: look again
            self._prioritized = {t.queue for t in self.registry.values() if t.flow.priority is not None}
            self._prioritized_at = len(self.registry)
        return queue in self._prioritized

    @property
    def store(self) -> Store:
        """The database's store (its engine is created on first use)."""
        if self._store is None:
            store = self._open_store()
            if isinstance(store, SqlStore) and not store.notifies_dispatchers:
                # The runtime's own outbox writes (a resume, a suspension's children) wake the
                # dispatchers as a submit does.
                store.wake_on_commit(lambda _namespace: self.wakeups.publish())
            self._store = store
        return self._store

    @property
    def store_opened(self) -> bool:
        """Whether the store (and its engine) exists yet."""
        return self._store is not None

    def transport(self) -> RedisStreamsTransport:
        """The Redis Streams transport of the running event loop."""
        return self._transports.get()

    def transport_for(self, queue: str) -> RedisStreamsTransport | None:
        """The transport serving ``queue``, or None while the queue is paused."""
        return None if queue in self.paused_queues else self._transports.get()

    @contextlib.contextmanager
    def substituted(self, store: Store, transport: RedisStreamsTransport) -> Iterator[None]:
        """Run on ``store`` and ``transport`` (on every event loop) until the block ends, then on
        the originals again; :mod:`durable_tasks.testing` runs an App this way on a test's database
        and an in-memory transport. The caller closes ``store`` afterwards."""
        saved = self._store, self._transports, self.subscribes_to_results
        self._store, self.subscribes_to_results = store, False
        transport.prioritized = self.prioritized
        self._transports = LoopBound(lambda: transport, close_stale=lambda _: None, aclose=_keep_open)
        try:
            yield
        finally:
            self._store, self._transports, self.subscribes_to_results = saved

    def outbox_waiter(self) -> OutboxWaiter:
        """How the dispatcher waits between passes: the store's notification, or the poll
        ended early by a wake-up on Redis (a substituted transport without pub/sub: the poll)."""
        store = self.store
        if store.notifies_dispatchers or not self.subscribes_to_results:
            return store.outbox_waiter(self.settings.namespace)
        client = self.transport().client
        if not isinstance(client, redis.asyncio.Redis):  # a cluster client has no pub/sub here
            return store.outbox_waiter(self.settings.namespace)
        return RedisWakeWaiter(client, wake_channel(self.settings.namespace))

    def wake_dispatchers_after_commit(self, session: Session) -> None:
        """Publish a wake-up when ``session`` commits, unless the database wakes them itself
        (or the runtime runs substituted, without Redis)."""
        self.publish_after_commit(session, ())

    @property
    def publishes_at_commit(self) -> bool:
        """Whether committed work sends its new entries itself, ahead of the dispatchers: with
        ``publish_on_commit``, in a runtime that talks to Redis (not one substituted onto an
        in-memory transport)."""
        return self.settings.publish_on_commit and self.subscribes_to_results

    def publish_after_commit(self, session: Session, messages: Sequence[OutgoingMessage]) -> None:
        """Once ``session`` commits, publish ``messages`` ahead of the dispatchers (with
        ``publish_on_commit``) and wake them where the database does not; nothing while the
        runtime runs substituted, without Redis (:mod:`.commit_publish`)."""
        if self.subscribes_to_results:
            if not self.publishes_at_commit:
                messages = ()
            self.wakeups.after_commit(session, messages, wake=not self.store.notifies_dispatchers)

    async def publish_committed(self, messages: Sequence[OutgoingMessage]) -> None:
        """Publish deliveries the runtime itself just committed (a suspension's children, the
        resume of a parent whose last child committed) ahead of the dispatchers, as a submit's
        commit does (:mod:`.commit_publish`): the task then starts without waiting for a
        dispatcher's wake-up, lease and publish. Best effort: the dispatcher publishes every
        row anyway (the same dedup key), so a publish that fails only costs that hop's latency."""
        if not messages or not self.publishes_at_commit:
            return
        try:
            await self.transport().publish(messages)
        except (RedisError, OSError) as exc:
            logger.debug("publishing %d committed deliveries failed (%s); the dispatcher will", len(messages), exc)

    def new_deliveries(self, deliveries: Sequence[NewDelivery]) -> list[OutgoingMessage]:
        """The entries the dispatcher would publish at once for deliveries the runtime wrote:
        not shadows, on queues not held paused here."""
        partitions = self.settings.queue_partitions
        return [
            delivery_message(d, partitions) for d in deliveries if not d.shadow and d.queue not in self.paused_queues
        ]

    def first_deliveries(
        self, intents: Sequence[NewTask], outcomes: Sequence[SubmitOutcome], now: datetime
    ) -> list[OutgoingMessage]:
        """The entries the dispatcher would publish at once for new tasks (a submit's, a
        suspension's children): due now, not shadows, on queues not held paused here
        (:mod:`.commit_publish`)."""
        partitions = self.settings.queue_partitions
        return [
            outgoing(
                queue=task.queue,
                task_id=outcome.task_id,
                generation=outcome.generation,
                delivery=0,
                name=task.name,
                traceparent=task.traceparent,
                shadow=False,
                partition_key=task.partition_key,
                partitions=partitions,
                priority=task.priority,
                concurrency_key=task.concurrency_key,
            )
            for task, outcome in zip(intents, outcomes, strict=True)
            if outcome.created
            and not task.shadow
            and (task.due is None or task.due <= now)
            and task.queue not in self.paused_queues
        ]

    def queues(self) -> list[str]:
        """Every queue a registered task uses."""
        return sorted({t.queue for t in self.registry.values()})

    async def aclose(self) -> None:
        """Close this loop's Redis client, the loops' database connections and the pool."""
        await self._transports.aclose()
        if self._store is not None:
            await self._store.aclose()
