"""Redis Streams transport: publish through the dedup script, consume through a group.

One class, async only. Every call that can be batched is: publishing a claimed batch is
one pipelined round trip, acknowledgements go per batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..flow.policy import PRIORITY_LEVELS
from .announce import announce, announce_failed
from .enqueue import enqueue_calls, entry_json, level_for, level_of
from .keys import CONSUMER_GROUP, QueueKeys
from .levels import never, read_by_level
from .messages import AutoclaimPage, Delivery, OutgoingMessage, StreamEntry, parse_autoclaim_reply, parse_delivery
from .reads import read_counted
from .scripts import Script

__all__ = ["QueueSnapshot", "RedisStreamsTransport", "stream_id_order"]

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

    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        namespace: str,
        *,
        dedup_ttl: timedelta,
        partitions: Mapping[str, int] | None = None,
        signing_key: bytes | None = None,
    ) -> None:
        self.client: Any = client
        self.signing_key = signing_key
        self.namespace = namespace
        self.cluster = isinstance(client, aioredis.RedisCluster)
        self.partitions = dict(partitions or {})
        self._dedup_ttl_ms = int(dedup_ttl.total_seconds() * 1000)
        self._enqueue = Script("enqueue_batch")
        self._scripts: dict[str, Script] = {}
        self._groups_ready: set[str] = set()
        #: Whether a queue has priority levels (durable_tasks.flow): the Runtime sets it from
        #: the registry. A queue without them keeps its one stream and its plain read.
        self.prioritized: Callable[[str], bool] = never
        #: Prioritized reads so far (the starvation guard's turn: flow.policy.guard_reserve).
        self.level_reads = 0

    def keys(self, queue: str, partition: int | None = None) -> QueueKeys:
        """Key names of ``queue`` (one partition of it) in this namespace."""
        return QueueKeys(self.namespace, queue, partition)

    def partition_keys(self, queue: str) -> list[QueueKeys]:
        """The keys of every partition of ``queue`` (one entry when it is not partitioned)."""
        count = self.partitions.get(queue, 1)
        if count <= 1:
            return [self.keys(queue)]
        return [self.keys(queue, p) for p in range(count)]

    def level_of(self, msg: OutgoingMessage) -> int:
        """The level stream a delivery goes to (:func:`.enqueue.level_of`)."""
        return level_of(msg, self.prioritized)

    def stream_of(self, queue: str, partition: int | None, *, shadow: bool, priority: int | None) -> str:
        """The stream a task's delivery was published to: its partition's, shadow or main, on
        its priority's level where ``queue`` has levels (:func:`.enqueue.level_for`)."""
        return self.keys(queue, partition).stream_for(
            shadow=shadow, priority=level_for(queue, priority, self.prioritized)
        )

    def streams(self, queue: str) -> list[tuple[str, bool, int | None]]:
        """Every stream of ``queue``: (key, shadow, partition) for each partition, main and
        shadow, and each priority level's of a prioritized queue."""
        levels = range(PRIORITY_LEVELS - 1, 0, -1) if self.prioritized(queue) else range(0)
        return [
            *(
                (keys.level_stream(level), False, keys.partition)
                for keys in self.partition_keys(queue)
                for level in levels
            ),
            *(
                (keys.stream_for(shadow=shadow), shadow, keys.partition)
                for keys in self.partition_keys(queue)
                for shadow in (False, True)
            ),
        ]

    async def run_script(self, name: str, keys: list[str], args: list[str | int]) -> Any:
        """Run ``lua/<name>.lua`` once (EVALSHA, loaded on first use); its reply, or raise."""
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = Script(name)
        [reply] = await self._evalsha_all(script, [(keys, args)])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _evalsha_all(self, script: Script, calls: Sequence[tuple[list[str], list[str | int]]]) -> list[Any]:
        """Run ``script`` once per (keys, args) in one pipelined round trip; loads the script
        (on every node) and retries the calls that found it missing."""
        replies = await self._pipeline_evalsha(script, calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            await self.client.script_load(script.source)
            again = await self._pipeline_evalsha(script, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline_evalsha(self, script: Script, calls: Sequence[tuple[list[str], list[str | int]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    # -- publish -------------------------------------------------------------------------

    async def publish(self, messages: Sequence[OutgoingMessage]) -> list[str | Exception]:
        """Publish deliveries in one round trip: one script call per stream (and per
        ``PUBLISH_CHUNK`` deliveries); one entry id or one error per message (a call that
        fails fails every delivery it carried)."""
        if not messages:
            return []
        plan = enqueue_calls(
            messages,
            namespace=self.namespace,
            dedup_ttl_ms=self._dedup_ttl_ms,
            signing_key=self.signing_key,
            prioritized=self.prioritized,
        )
        return plan.entry_ids(await self._evalsha_all(self._enqueue, plan.calls))

    # -- consume -------------------------------------------------------------------------

    def parse(self, fields: Mapping[str, str], stream: str) -> Delivery:
        """The delivery an entry carries, verified when signing is on (MalformedEntryError)."""
        return parse_delivery(fields, stream=stream, key=self.signing_key)

    async def ensure_group(self, stream: str) -> None:
        """Create the consumer group from 0-0 (MKSTREAM): entries older than it still run."""
        try:
            await self.client.xgroup_create(stream, CONSUMER_GROUP, id="0-0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups_ready.add(stream)

    async def read(self, queues: Iterable[str], consumer: str, *, count: int, block: timedelta) -> list[StreamEntry]:
        """Read up to ``count`` new entries for ``consumer`` from every stream of ``queues``
        (all partitions, main and shadow)."""
        by_stream = {
            stream: (queue, shadow, partition) for queue in queues for stream, shadow, partition in self.streams(queue)
        }
        for stream in by_stream:
            if stream not in self._groups_ready:
                await self.ensure_group(stream)
        prioritized = any(self.prioritized(q) for q, _, _ in by_stream.values())
        if self.cluster:
            reply = (await read_by_level(self, list(by_stream), consumer, count))[0] if prioritized else []
            reply = reply or await self._read_cluster(by_stream, consumer, count, block)
        elif prioritized or len({(q, p) for q, _, p in by_stream.values()}) > 1:  # COUNT is per stream
            reply = await read_counted(self, list(by_stream), consumer, count, block, prioritized=prioritized)
        else:
            reply = await self._read_recreating(list(by_stream), consumer, count, block)
        out: list[StreamEntry] = []
        for stream, entries in reply:
            queue, shadow, partition = by_stream[str(stream)]
            for entry_id, fields in entries:
                out.append(StreamEntry(queue, shadow, str(entry_id), dict(fields or {}), str(stream), partition))
        return out

    async def _read_recreating(
        self, streams: list[str], consumer: str, count: int, block: timedelta | None
    ) -> list[Any]:
        try:
            return await self._xreadgroup(streams, consumer, count, block)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The group vanished (Redis restarted empty, or an operator deleted it): recreate
            # it from 0-0; anything lost with it is the reconciler's to redispatch.
            logger.warning("consumer group missing, recreating it: %s", exc)
            for stream in streams:
                await self.ensure_group(stream)
            return await self._xreadgroup(streams, consumer, count, block)

    async def _read_cluster(
        self, by_stream: Mapping[str, tuple[str, bool, int | None]], consumer: str, count: int, block: timedelta
    ) -> list[Any]:
        """One XREADGROUP per slot (a command may not cross slots): sweep them without
        blocking; when every one was empty, wait a little and sweep once more."""
        by_tag: dict[str, list[str]] = defaultdict(list)
        for stream in by_stream:
            by_tag[stream.split("}", 1)[0]].append(stream)
        for attempt in range(2):
            replies: list[Any] = []
            for streams in by_tag.values():
                if (left := count - sum(len(e) for _, e in replies)) <= 0:
                    break
                try:
                    replies += await self._read_recreating(streams, consumer, left, None)
                except RedisError as exc:  # one failing node (a failover) must not stop the others
                    logger.warning("reading %s failed (%s); reading the other partitions", streams[0], exc)
            if replies or attempt:
                return replies
            await anyio.sleep(min(block.total_seconds(), 0.05))
        return []

    async def _xreadgroup(self, streams: list[str], consumer: str, count: int, block: timedelta | None) -> list[Any]:
        block_ms = None if block is None else max(1, int(block.total_seconds() * 1000))
        result: Any = await self.client.xreadgroup(
            CONSUMER_GROUP, consumer, dict.fromkeys(streams, ">"), count=count, block=block_ms
        )
        return list(result or [])

    async def ack(self, stream: str, entry_ids: Sequence[str]) -> int:
        """Acknowledge entries of one stream; returns how many were pending."""
        if not entry_ids:
            return 0
        return int(await self.client.xack(stream, CONSUMER_GROUP, *entry_ids))

    async def ack_and_announce(self, acks: Mapping[str, Sequence[str]], channel: str, message: str | None) -> None:
        """Acknowledge entries (ids per stream) and PUBLISH ``message`` on ``channel``, in one
        round trip: a group commit's tail, which at a low task rate is one task's. Raises what
        an XACK raised; a failed announcement is logged and dropped (result waits fall back to
        reading the database). On a cluster, a command per node, concurrently."""
        if not acks and message is None:
            return
        if self.cluster:
            await asyncio.gather(
                *(self.ack(stream, ids) for stream, ids in acks.items()), announce(self.client, channel, message)
            )
            return
        pipe = self.client.pipeline(transaction=False)
        for stream, ids in acks.items():
            pipe.xack(stream, CONSUMER_GROUP, *ids)
        if message is not None:
            pipe.publish(channel, message)
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies[: len(acks)]:
            if isinstance(reply, Exception):
                raise reply
        if message is not None and isinstance(replies[-1], Exception):
            announce_failed(replies[-1])

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

    async def dead_letter(self, queue: str, what: str, fields: dict[str, str]) -> str:
        """Append ``fields`` to the queue's dead-letter stream once per ``what`` (a delivery
        ``task:generation:delivery`` or ``entry:<id>``): a retry after a crash adds nothing."""
        keys = self.keys(queue)
        args: list[str | int] = [self._dedup_ttl_ms, entry_json(fields)]
        [reply] = await self._evalsha_all(self._enqueue, [([keys.dlq, keys.dlq_dedup(what)], args)])
        if isinstance(reply, Exception):
            raise reply
        [entry_id] = reply
        return str(entry_id)

    async def dead_letter_page(self, queue: str, *, after: str | None, count: int) -> list[tuple[str, dict[str, str]]]:
        """Up to ``count`` entries (id, fields) of the queue's dead-letter stream, oldest first,
        from its start or after the entry id ``after`` (exclusive)."""
        raw: Any = await self.client.xrange(self.keys(queue).dlq, min=f"({after}" if after else "-", count=count)
        return [(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for i, f in raw or []]

    async def forget_dead_letters(self, queue: str, entry_ids: Sequence[str]) -> int:
        """Delete entries of the queue's dead-letter stream; returns how many there were."""
        return int(await self.client.xdel(self.keys(queue).dlq, *entry_ids)) if entry_ids else 0

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
        """Trim acknowledged entries: MINID below the oldest pending and undelivered entry.

        The group's last delivered id is read before its PEL: an entry a worker reads in
        between is then in the PEL read, and the floor stays at or below it. Read the other
        way round, the floor could pass it and trim an entry its worker still holds (whose loss
        the PEL scan would then never see: XAUTOCLAIM drops a deleted entry)."""
        try:
            groups = await self.client.xinfo_groups(stream)
            summary = await self.client.xpending(stream, CONSUMER_GROUP)
        except ResponseError:
            return 0
        group = next((g for g in groups if str(g["name"]) == CONSUMER_GROUP), None)
        if group is None:
            return 0
        floor = str(group["last-delivered-id"])
        if summary["pending"]:
            floor = min(floor, str(summary["min"]), key=stream_id_order)
        return int(await self.client.xtrim(stream, minid=floor, approximate=False))

    async def snapshot(self, queue: str, *, now_ms: int | None = None) -> QueueSnapshot:
        """PEL size, oldest pending age, DLQ and stream length of a queue (all partitions and,
        on a prioritized queue, all levels).

        Each stream's lag is read before its PEL: an entry that a worker reads in between is
        then counted in the lag, where the other order would find it in neither."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        pel_size, oldest_age, lag, stream_length = 0, 0.0, 0, 0
        for stream in (s for s, shadow, _ in self.streams(queue) if not shadow):
            try:
                for group in await self.client.xinfo_groups(stream):
                    if str(group["name"]) == CONSUMER_GROUP and group.get("lag") is not None:
                        lag += int(group["lag"])  # entries not yet read by the group (Redis 7+)
                summary = await self.client.xpending(stream, CONSUMER_GROUP)
                pel_size += int(summary["pending"])
                if summary["pending"]:
                    oldest_age = max(oldest_age, (now_ms - _entry_ms(str(summary["min"]))) / 1000)
            except ResponseError:
                pass  # no stream or group yet: nothing pending
            stream_length += int(await self.client.xlen(stream))
        dlq_length = int(await self.client.xlen(self.keys(queue).dlq))
        return QueueSnapshot(pel_size, oldest_age, dlq_length, stream_length, lag)


def stream_id_order(entry_id: str) -> tuple[int, int]:
    """An entry id (``<ms>-<seq>``) as the order Redis gives entries."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
