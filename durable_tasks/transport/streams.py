"""Redis Streams transport: publish through the dedup script, consume through a group.

One class, async only. Every call that can be batched is: publishing a claimed batch is
one pipelined round trip, acknowledgements go per batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .keys import CONSUMER_GROUP, QueueKeys
from .messages import AutoclaimPage, OutgoingMessage, StreamEntry, parse_autoclaim_reply
from .scripts import lua_source

__all__ = ["QueueSnapshot", "RedisStreamsTransport"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """What Redis says about one queue right now."""

    pel_size: int
    oldest_pending_age_s: float
    dlq_length: int
    stream_length: int
    stream_lag: int


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


class RedisStreamsTransport:
    """Publishes deliveries to, and consumes them from, the streams of one namespace."""

    def __init__(self, client: aioredis.Redis, namespace: str, *, dedup_ttl: timedelta) -> None:
        self.client = client
        self.namespace = namespace
        self._dedup_ttl_ms = int(dedup_ttl.total_seconds() * 1000)
        self._enqueue = client.register_script(lua_source("enqueue"))
        self._groups_ready: set[str] = set()

    def keys(self, queue: str) -> QueueKeys:
        """Key names of ``queue`` in this namespace."""
        return QueueKeys(self.namespace, queue)

    # -- publish -------------------------------------------------------------------------

    async def publish(self, messages: Sequence[OutgoingMessage]) -> list[str | Exception]:
        """Publish deliveries in one round trip; one entry id or one error per message."""
        if not messages:
            return []
        pipe = self.client.pipeline(transaction=False)
        for msg in messages:
            keys = self.keys(msg.queue)
            args: list[str | int] = [self._dedup_ttl_ms]
            for field, value in msg.fields().items():
                args += [field, value]
            await self._enqueue(
                keys=[keys.stream_for(shadow=msg.shadow), keys.dedup(msg.task_id, msg.generation, msg.delivery)],
                args=args,
                client=pipe,
            )
        replies = await pipe.execute(raise_on_error=False)
        return [r if isinstance(r, Exception) else str(r) for r in replies]

    # -- consume -------------------------------------------------------------------------

    async def ensure_group(self, stream: str) -> None:
        """Create the consumer group from 0-0 (MKSTREAM): entries older than it still run."""
        try:
            await self.client.xgroup_create(stream, CONSUMER_GROUP, id="0-0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups_ready.add(stream)

    async def read(
        self, queues: Iterable[tuple[str, bool]], consumer: str, *, count: int, block: timedelta
    ) -> list[StreamEntry]:
        """Read up to ``count`` new entries for ``consumer`` from (queue, shadow) streams."""
        by_stream = {self.keys(q).stream_for(shadow=s): (q, s) for q, s in queues}
        for stream in by_stream:
            if stream not in self._groups_ready:
                await self.ensure_group(stream)
        try:
            reply = await self._xreadgroup(by_stream, consumer, count, block)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The group vanished (Redis restarted empty, or an operator deleted it): recreate
            # it from 0-0; anything lost with it is the reconciler's to redispatch.
            logger.warning("consumer group missing, recreating it: %s", exc)
            for stream in by_stream:
                await self.ensure_group(stream)
            reply = await self._xreadgroup(by_stream, consumer, count, block)
        out: list[StreamEntry] = []
        for stream, entries in reply or []:
            queue, shadow = by_stream[str(stream)]
            for entry_id, fields in entries:
                out.append(StreamEntry(queue, shadow, str(entry_id), dict(fields or {})))
        return out

    async def _xreadgroup(
        self, by_stream: dict[str, tuple[str, bool]], consumer: str, count: int, block: timedelta
    ) -> list[Any]:
        streams: dict[Any, Any] = dict.fromkeys(by_stream, ">")
        block_ms = max(1, int(block.total_seconds() * 1000))
        result: Any = await self.client.xreadgroup(CONSUMER_GROUP, consumer, streams, count=count, block=block_ms)
        return list(result or [])

    async def ack(self, stream: str, entry_ids: Sequence[str]) -> int:
        """Acknowledge entries of one stream; returns how many were pending."""
        if not entry_ids:
            return 0
        return int(await self.client.xack(stream, CONSUMER_GROUP, *entry_ids))

    # -- recovery ------------------------------------------------------------------------

    async def autoclaim(
        self, stream: str, consumer: str, *, min_idle: timedelta, cursor: str, count: int
    ) -> AutoclaimPage:
        """Claim entries idle at least ``min_idle`` for ``consumer`` (XAUTOCLAIM page)."""
        try:
            reply = await self.client.xautoclaim(
                stream,
                CONSUMER_GROUP,
                consumer,
                min_idle_time=int(min_idle.total_seconds() * 1000),
                start_id=cursor,
                count=count,
            )
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                return AutoclaimPage("0-0", [], [])
            raise
        return parse_autoclaim_reply(reply)

    async def idle_times(self, stream: str, entry_ids: Sequence[str]) -> dict[str, int]:
        """Idle milliseconds of pending entries (absent: not pending)."""
        out: dict[str, int] = {}
        for entry_id in entry_ids:
            rows = await self.client.xpending_range(stream, CONSUMER_GROUP, min=entry_id, max=entry_id, count=1)
            for row in rows:
                out[str(row["message_id"])] = int(row["time_since_delivered"])
        return out

    async def dead_letter(self, queue: str, what: str, fields: dict[str, str]) -> str:
        """Append ``fields`` to the queue's dead-letter stream once per ``what`` (a delivery
        ``task:generation:delivery`` or ``entry:<id>``): a retry after a crash adds nothing."""
        keys = self.keys(queue)
        args: list[str | int] = [self._dedup_ttl_ms]
        for name, value in fields.items():
            args += [name, value]
        reply = await self._enqueue(keys=[keys.dlq, keys.dlq_dedup(what)], args=args)
        return str(reply)

    async def dead_letter_malformed(
        self, queue: str, stream: str, entry_id: str, fields: Mapping[str, str], reason: str
    ) -> None:
        """Park an entry that names no task in the DLQ (once), then acknowledge it."""
        await self.dead_letter(queue, f"entry:{entry_id}", {**fields, "dt_reason": reason[:500], "dt_entry": entry_id})
        await self.ack(stream, [entry_id])

    async def entries_exist(self, stream: str, entry_ids: Sequence[str]) -> list[bool]:
        """Whether each entry id is still in the stream (one pipelined round trip)."""
        if not entry_ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.xrange(stream, min=entry_id, max=entry_id, count=1)
        return [bool(r) for r in await pipe.execute()]

    async def trim(self, stream: str) -> int:
        """Trim acknowledged entries: MINID below the oldest pending and undelivered entry."""
        try:
            summary = await self.client.xpending(stream, CONSUMER_GROUP)
            groups = await self.client.xinfo_groups(stream)
        except ResponseError:
            return 0
        group = next((g for g in groups if str(g["name"]) == CONSUMER_GROUP), None)
        if group is None:
            return 0
        floor = str(group["last-delivered-id"])
        if summary["pending"]:
            floor = min(floor, str(summary["min"]), key=_stream_id_key)
        return int(await self.client.xtrim(stream, minid=floor, approximate=False))

    async def snapshot(self, queue: str, *, now_ms: int | None = None) -> QueueSnapshot:
        """PEL size, oldest pending age, DLQ and stream length of a queue."""
        keys = self.keys(queue)
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        pel_size, oldest_age = 0, 0.0
        try:
            summary = await self.client.xpending(keys.stream, CONSUMER_GROUP)
            pel_size = int(summary["pending"])
            if pel_size:
                oldest_age = max(0.0, (now_ms - _entry_ms(str(summary["min"]))) / 1000)
        except ResponseError:
            pass  # no stream or group yet: nothing pending
        lag = 0
        try:
            for group in await self.client.xinfo_groups(keys.stream):
                if str(group["name"]) == CONSUMER_GROUP and group.get("lag") is not None:
                    lag = int(group["lag"])  # entries not yet read by the group (Redis 7+)
        except ResponseError:
            pass
        dlq_length = int(await self.client.xlen(keys.dlq))
        stream_length = int(await self.client.xlen(keys.stream))
        return QueueSnapshot(pel_size, oldest_age, dlq_length, stream_length, lag)


def _stream_id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
