"""Waking dispatchers through Redis where the database cannot (MySQL/MariaDB, SQLite).

PostgreSQL's submits NOTIFY the dispatchers' LISTEN at commit. The other databases have no such
channel, so their dispatchers poll the outbox every ``poll_interval``, and a task submitted
into an idle system waits up to that long. Here a submit in the caller's session asks for a
wake-up, and once that session's transaction commits (never before: a dispatcher woken early
would find nothing), one ``PUBLISH`` on the namespace's wake channel ends the dispatchers' wait
(:class:`RedisWakeWaiter`, subscribed there). On the embedded default (no Redis URL) the
channel is on the data directory's Valkey, which the dispatchers and workers run on: a
process publishes there once that server's socket exists, and never starts the server for a
wake-up (where it does not run, no dispatcher does either). The wake-up is an optimization
only: a publish that fails or a subscription that drops leaves the poll as it was, so
correctness never depends on Redis delivering it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import redis
import redis.asyncio
from redis.exceptions import RedisClusterException
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from .embedded import valkey_socket
from .settings import Settings
from .transport.cluster_url import is_cluster_url, sync_cluster_client
from .transport.keys import wake_channel

__all__ = ["CommitWakeups", "RedisWakeWaiter"]

logger = logging.getLogger(__name__)

#: A publish that takes longer is given up (the dispatchers' poll covers it).
_PUBLISH_TIMEOUT = 0.25
#: How long a new subscription waits for Redis to confirm it.
_SUBSCRIBE_CHECK = 2.0


class CommitWakeups:
    """Publishes one wake-up per committed transaction that wrote outbox rows (one per App)."""

    def __init__(self, settings: Settings) -> None:
        self._channel = wake_channel(settings.namespace)
        self._cluster = settings.redis_cluster
        self._redis_url = settings.redis_url
        #: The embedded default's server, used only while its socket exists: a process that
        #: only submits must not start a Valkey for its wake-ups.
        self._embedded: Path | None = None if settings.redis_url else valkey_socket(settings.data_dir)
        self._enabled = True
        self._key = f"durable_tasks.wake:{self._channel}"  # session.info: a wake-up is owed at commit
        self._lock = threading.Lock()
        self._client: tuple[int, Any] | None = None  # (pid, client): a forked child makes its own

    def disable(self) -> None:
        """Publish nothing from now on (the dispatchers poll): for measuring what it saves."""
        self._enabled = False

    def after_commit(self, session: Session) -> None:
        """Publish a wake-up once ``session``'s transaction commits: not when it rolls back or
        closes uncommitted, nor for rows written in a savepoint that rolled back."""
        if not self._enabled:
            return
        # Marked on the innermost transaction, the one whose rollback takes the rows away.
        marked = session.get_nested_transaction() or session.get_transaction()
        session.info.setdefault(self._key, set()).add(marked)
        if not event.contains(session, "after_commit", self._committed):
            event.listen(session, "after_commit", self._committed)
            event.listen(session, "after_soft_rollback", self._rolled_back)
            event.listen(session, "after_transaction_end", self._ended)

    def _committed(self, session: Session) -> None:
        if session.info.pop(self._key, None):
            self.publish()

    def _rolled_back(self, session: Session, previous_transaction: SessionTransaction) -> None:
        marked: set[SessionTransaction] | None = session.info.get(self._key)
        if marked:
            marked.difference_update([t for t in marked if _within(t, previous_transaction)])

    def _ended(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # the outermost, committed (published) or not
            session.info.pop(self._key, None)

    def publish(self) -> None:
        """One PUBLISH on the wake channel; a failure is logged and left to the poll.

        A cluster client that finds no node raises RedisClusterException, which is no RedisError:
        caught too, or it would fail the caller's commit (this runs in its ``after_commit``).
        """
        if not self._enabled:
            return
        url = self._redis_url
        if url is None:  # the embedded default: its server, if it runs
            assert self._embedded is not None
            if not self._embedded.exists():
                return
            url = f"unix://{self._embedded}"
        try:
            self._redis(url).publish(self._channel, "1")
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            logger.debug("waking the dispatchers through Redis failed (they poll): %s", exc)

    def _redis(self, url: str) -> Any:
        with self._lock:
            if self._client is None or self._client[0] != os.getpid():
                timeouts = {"socket_timeout": _PUBLISH_TIMEOUT, "socket_connect_timeout": _PUBLISH_TIMEOUT}
                if self._cluster or is_cluster_url(url):
                    client: Any = sync_cluster_client(url, **timeouts)
                else:
                    client = redis.Redis.from_url(url, **timeouts)
                self._client = (os.getpid(), client)
            return self._client[1]


def _within(transaction: SessionTransaction | None, outer: SessionTransaction) -> bool:
    """Whether ``transaction`` is ``outer`` or nested inside it."""
    while transaction is not None:
        if transaction is outer:
            return True
        transaction = transaction.parent
    return False


class RedisWakeWaiter:
    """A dispatcher's wait: a message on the wake channel ends it early, else the timeout."""

    def __init__(self, client: redis.asyncio.Redis, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._pubsub: Any = None
        self._warned = False

    async def _subscribe(self) -> Any:
        if self._pubsub is None:
            pubsub = self._client.pubsub()
            await pubsub.subscribe(self._channel)
            self._pubsub = pubsub
            # Subscribed once Redis confirms (the first message on this connection): a
            # publish from then on is delivered to it.
            await pubsub.get_message(timeout=_SUBSCRIBE_CHECK)
        return self._pubsub

    async def listen(self) -> None:
        """Subscribe now, so a wake-up published from here on ends the next wait; a failure
        is left to :meth:`wait`, which reports it and polls."""
        try:
            await self._subscribe()
        except (redis.RedisError, OSError) as exc:
            logger.debug("subscribing to the wake-ups failed (%s); the wait retries it", exc)
            await self._drop()

    async def wait(self, timeout: timedelta) -> None:
        """Return on a wake-up, or after ``timeout`` (the poll)."""
        deadline = anyio.current_time() + timeout.total_seconds()
        try:
            await self._subscribe()
            while (left := deadline - anyio.current_time()) > 0:
                if await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=left) is not None:
                    return
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            if not self._warned:
                logger.warning("the dispatcher's wake-up subscription failed (%s): polling until it is back", exc)
                self._warned = True
            await self._drop()
            await anyio.sleep(max(0.0, deadline - anyio.current_time()))

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(redis.RedisError, RedisClusterException, OSError):
                    await pubsub.aclose()

    async def aclose(self) -> None:
        """Unsubscribe."""
        await self._drop()
