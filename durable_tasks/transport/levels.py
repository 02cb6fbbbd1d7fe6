"""Prioritized reads (durable_tasks.flow): the level streams of a queue, highest first, in one
Lua call per cluster slot (``lua/read_levels.lua``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Protocol

from redis.exceptions import ResponseError

from ..flow.policy import guard_reserve
from .keys import CONSUMER_GROUP

__all__ = ["LevelReader", "level_of", "never", "read_by_level"]


class LevelReader(Protocol):
    """What a prioritized read needs of the transport (RedisStreamsTransport)."""

    cluster: bool
    level_reads: int

    async def run_script(self, name: str, keys: list[str], args: list[str | int]) -> Any: ...

    async def ensure_group(self, stream: str) -> None: ...


def never(_queue: str) -> bool:
    """No queue has levels: a transport's default until its Runtime says otherwise."""
    return False


def level_of(stream: str) -> int:
    """A stream's priority level: ``…:stream:p<level>``; 0 for level 0, -1 for shadow."""
    head, _, level = stream.rpartition(":p")
    if head.endswith(":stream") and level.isdigit():
        return int(level)
    return -1 if stream.endswith(":shadow") else 0


async def read_by_level(transport: LevelReader, streams: list[str], consumer: str, count: int) -> list[Any]:
    """A prioritized read, highest level first with the starvation guard's reserve; never
    blocks (the caller's plain read blocks when this finds nothing). ``streams`` come from
    ``RedisStreamsTransport.streams``. The reply has XREADGROUP's shape."""
    ordered = sorted(streams, key=level_of, reverse=True)  # stable: queue order within a level
    by_tag: dict[str, list[str]] = defaultdict(list)
    for stream in ordered:
        by_tag[stream.split("}", 1)[0] if transport.cluster else ""].append(stream)
    reserve = guard_reserve(count, transport.level_reads)
    transport.level_reads += 1
    out: list[Any] = []
    left = count
    for keys in by_tag.values():  # one slot per call: one call, or one per slot on a cluster
        if left <= 0:
            break
        try:
            reply = await transport.run_script(
                "read_levels", keys, [CONSUMER_GROUP, consumer, left, min(reserve, left)]
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            for stream in keys:  # recreated; this read finds nothing there, the next one does
                await transport.ensure_group(stream)
            continue
        for stream, entries in reply:  # a script's reply has flat field lists: as XREADGROUP's
            out.append([stream, [(entry_id, dict(zip(f[::2], f[1::2], strict=True))) for entry_id, f in entries]])
            left -= len(entries)
    return out
