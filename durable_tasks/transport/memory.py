"""An in-memory transport: the streams of one namespace in this process, for
:mod:`durable_tasks.testing`.

It keeps what the Redis transport promises the loops: entries are read highest priority level
first (without the starvation guard: a drain reads everything anyway); a delivery (task, generation, delivery)
is published once however often it is republished (the dedup key of ``enqueue_batch.lua``); an
entry read stays pending until it is acknowledged; a dead letter is added once per delivery.
Entries carry the same fields, signed when a signing key is set, so the worker parses and
verifies them as it does entries read from Redis. Nothing is ever lost, so nothing needs
reclaiming: ``autoclaim`` finds no idle entry. Flow control's admission runs in Python on the
App's clock (:mod:`.memory_flow`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio

from ..clock import Clock
from .memory_flow import MemoryFlow
from .messages import AutoclaimPage, OutgoingMessage, StreamEntry
from .streams import QueueSnapshot, RedisStreamsTransport, stream_id_order

__all__ = ["MemoryTransport"]


class _Pipeline:
    """The one pipeline the loops send outside the transport: freeing concurrency slots."""

    def __init__(self, flow: MemoryFlow) -> None:
        self._flow = flow
        self._removals: list[tuple[str, str]] = []

    def zrem(self, key: str, member: str) -> None:
        self._removals.append((key, member))

    async def execute(self) -> list[int]:
        return [self._flow.remove(key, member) for key, member in self._removals]


class _NoRedis:
    """The client the loops reach through ``transport.client``: result announcements go
    nowhere (result waits read the database), everything else is answered locally."""

    def __init__(self, flow: MemoryFlow) -> None:
        self.announced: list[tuple[str, str]] = []
        self._flow = flow

    def pipeline(self, transaction: bool = False) -> _Pipeline:
        return _Pipeline(self._flow)

    # the limits' run-time settings (durable_tasks.flow.control)
    async def hget(self, key: str, field: str) -> str | None:
        return self._flow.hashes.get(key, {}).get(field)

    async def hmget(self, key: str, fields: list[str]) -> list[str | None]:
        return [self._flow.hashes.get(key, {}).get(f) for f in fields]

    async def hset(self, key: str, field: str, value: str) -> int:
        self._flow.hashes.setdefault(key, {})[field] = value
        return 1

    async def hdel(self, key: str, field: str) -> int:
        return 1 if self._flow.hashes.get(key, {}).pop(field, None) is not None else 0

    async def publish(self, channel: str, message: str) -> int:
        self.announced.append((channel, message))
        return 0

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class _Stream:
    entries: dict[str, dict[str, str]] = field(default_factory=dict)  # every entry not trimmed
    unread: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)


class MemoryTransport(RedisStreamsTransport):
    """The streams of one namespace, in memory (see the module docstring)."""

    def __init__(
        self,
        namespace: str,
        *,
        clock: Clock,
        partitions: Mapping[str, int] | None = None,
        signing_key: bytes | None = None,
    ) -> None:
        #: Flow control's admission (rates, concurrency slots) on ``clock``.
        self.flow = MemoryFlow(lambda: int(clock().timestamp() * 1000))
        client: Any = _NoRedis(self.flow)
        super().__init__(client, namespace, dedup_ttl=timedelta(days=1), partitions=partitions, signing_key=signing_key)
        self._streams: dict[str, _Stream] = {}
        self._dedup: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._published: anyio.Event | None = None

    def _stream(self, key: str) -> _Stream:
        return self._streams.setdefault(key, _Stream())

    def _append(self, stream: str, fields: dict[str, str]) -> str:
        entry_id = f"{next(self._ids)}-0"
        target = self._stream(stream)
        target.entries[entry_id] = fields
        target.unread.append(entry_id)
        if self._published is not None:
            self._published.set()
        return entry_id

    def unread(self, queues: Iterable[str]) -> int:
        """How many entries of ``queues`` no worker has read yet."""
        return sum(
            len(self._streams[stream].unread)
            for queue in queues
            for stream, _, _ in self.streams(queue)
            if stream in self._streams
        )

    def pending(self) -> int:
        """How many entries were read and not acknowledged (their worker gave up on them)."""
        return sum(len(s.pending) for s in self._streams.values())

    @property
    def announcements(self) -> int:
        """How many result announcements the loops sent (to nobody)."""
        return len(self.client.announced)

    # -- what the dispatcher and the worker call ---------------------------------------------

    async def publish(self, messages: Sequence[OutgoingMessage]) -> list[str | Exception]:
        out: list[str | Exception] = []
        for msg in messages:
            keys = self.keys(msg.queue, msg.partition)
            stream = keys.stream_for(shadow=msg.shadow, priority=self.level_of(msg))
            dedup = keys.dedup(msg.task_id, msg.generation, msg.delivery)
            if dedup not in self._dedup:
                self._dedup[dedup] = self._append(stream, msg.fields(stream, self.signing_key))
            out.append(self._dedup[dedup])
        await anyio.lowlevel.checkpoint()
        return out

    async def ensure_group(self, stream: str) -> None:
        self._stream(stream)

    async def read(self, queues: Iterable[str], consumer: str, *, count: int, block: timedelta) -> list[StreamEntry]:
        queues = list(queues)
        found = self._take(queues, count)
        if not found:
            self._published = anyio.Event()
            with anyio.move_on_after(block.total_seconds()):
                await self._published.wait()
            self._published = None
            found = self._take(queues, count)
        await anyio.lowlevel.checkpoint()
        return found

    def _take(self, queues: list[str], count: int) -> list[StreamEntry]:
        out: list[StreamEntry] = []
        for queue in queues:
            for stream, shadow, partition in self.streams(queue):
                target = self._streams.get(stream)
                while target is not None and target.unread and len(out) < count:
                    entry_id = target.unread.pop(0)
                    target.pending.add(entry_id)
                    out.append(StreamEntry(queue, shadow, entry_id, dict(target.entries[entry_id]), stream, partition))
        return out

    async def ack(self, stream: str, entry_ids: Sequence[str]) -> int:
        target = self._stream(stream)
        acked = [i for i in entry_ids if i in target.pending]
        target.pending.difference_update(acked)
        return len(acked)

    async def ack_and_announce(self, acks: Mapping[str, Sequence[str]], channel: str, message: str | None) -> None:
        for stream, ids in acks.items():
            await self.ack(stream, ids)
        if message is not None:
            await self.client.publish(channel, message)

    async def dead_letter(self, queue: str, what: str, fields: dict[str, str]) -> str:
        keys = self.keys(queue)
        dedup = keys.dlq_dedup(what)
        if dedup not in self._dedup:
            self._dedup[dedup] = self._append(keys.dlq, fields)
            self._stream(keys.dlq).unread.clear()  # nobody reads a dead-letter stream
        return self._dedup[dedup]

    def dead_letters(self, queue: str) -> list[dict[str, str]]:
        """The fields of every entry of ``queue``'s dead-letter stream, oldest first."""
        target = self._streams.get(self.keys(queue).dlq)
        return [] if target is None else [dict(f) for f in target.entries.values()]

    async def dead_letter_page(self, queue: str, *, after: str | None, count: int) -> list[tuple[str, dict[str, str]]]:
        target = self._streams.get(self.keys(queue).dlq)
        if target is None:
            return []
        later = [i for i in target.entries if after is None or stream_id_order(i) > stream_id_order(after)]
        return [(i, dict(target.entries[i])) for i in later[:count]]

    async def forget_dead_letters(self, queue: str, entry_ids: Sequence[str]) -> int:
        target = self._streams.get(self.keys(queue).dlq)
        return sum(target.entries.pop(i, None) is not None for i in entry_ids) if target else 0

    async def run_script(self, name: str, keys: list[str], args: list[str | int]) -> Any:
        await anyio.lowlevel.checkpoint()
        return self.flow.run(name, keys, args)

    # -- what the reaper and the statistics call -----------------------------------------------

    async def autoclaim(
        self, stream: str, consumer: str, *, min_idle: timedelta, cursor: str, count: int
    ) -> AutoclaimPage:
        return AutoclaimPage("0-0", [], [])

    async def entries_exist(self, stream: str, entry_ids: Sequence[str]) -> list[bool]:
        target = self._streams.get(stream)
        return [target is not None and i in target.entries for i in entry_ids]

    async def trim(self, stream: str) -> int:
        target = self._streams.get(stream)
        if target is None:
            return 0
        keep = target.pending | set(target.unread)
        gone = [i for i in target.entries if i not in keep]
        for entry_id in gone:
            del target.entries[entry_id]
        return len(gone)

    async def snapshot(self, queue: str, *, now_ms: int | None = None) -> QueueSnapshot:
        streams = [self._streams.get(keys.stream) for keys in self.partition_keys(queue)]
        dlq = self._streams.get(self.keys(queue).dlq)
        return QueueSnapshot(
            pel_size=sum(len(s.pending) for s in streams if s),
            oldest_pending_age_s=0.0,
            dlq_length=len(dlq.entries) if dlq else 0,
            stream_length=sum(len(s.entries) for s in streams if s),
            stream_lag=sum(len(s.unread) for s in streams if s),
        )
