"""The dispatcher's wait where the database has no notification (MySQL/MariaDB, SQLite).

PostgreSQL's submits NOTIFY the dispatchers' LISTEN at commit. The other databases have no such
channel, so their dispatchers poll the outbox every ``poll_interval``, and a task submitted
into an idle system would wait up to that long. A committed submit publishes on the
namespace's wake channel (:mod:`durable_tasks.commit_publish`); :class:`RedisWakeWaiter`,
subscribed there, ends the dispatcher's wait. The wake-up is an optimization only: a publish
that fails or a subscription that drops leaves the poll as it was, so correctness never
depends on Redis delivering it.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

import anyio
import redis
import redis.asyncio
from redis.exceptions import RedisClusterException

__all__ = ["RedisWakeWaiter"]

logger = logging.getLogger(__name__)

#: How long a new subscription waits for Redis to confirm it.
_SUBSCRIBE_CHECK = 2.0


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
