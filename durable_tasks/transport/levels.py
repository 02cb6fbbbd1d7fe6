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


async def read_by_level(
    transport: LevelReader, streams: list[str], consumer: str, count: int
) -> tuple[list[Any], dict[str, str]]:
    """A prioritized read, highest level first with the starvation guard's reserve; never
    blocks. ``streams`` come from ``RedisStreamsTransport.streams``. Returns the reply, in
    XREADGROUP's shape, and when it found nothing each stream's last entry id, for a wait
    (:mod:`.reads`).

    A script call reads the streams of one cluster slot (all of them, off a cluster). A
    queue's partitions have slots of their own, so on a cluster each slot's call gets a fair
    share of ``count`` first, and what a slot leaves goes to those that filled theirs: one
    partition's backlog of low entries never keeps another's high ones out of the read."""
    ordered = sorted(streams, key=level_of, reverse=True)  # stable: queue order within a level
    by_tag: dict[str, list[str]] = defaultdict(list)
    for stream in ordered:
        by_tag[stream.split("}", 1)[0] if transport.cluster else ""].append(stream)
    reads = transport.level_reads
    transport.level_reads += 1
    out: list[Any] = []
    last: dict[str, str] = {}
    left = count
    slots = list(by_tag.values())
    while slots and left > 0:
        share, filled = max(1, left // len(slots)), []
        for keys in slots:
            want = min(share, left)
            if want <= 0:
                break
            args: list[str | int] = [CONSUMER_GROUP, consumer, want, guard_reserve(want, reads)]
            got = await run_read_script(transport, "read_levels", keys, args, out, last)
            left -= got
            if got == want:  # it may hold more
                filled.append(keys)
        slots = filled
    return out, ({} if out else last)


async def run_read_script(
    transport: LevelReader, name: str, keys: list[str], args: list[str | int], out: list[Any], last: dict[str, str]
) -> int:
    """One call of a read script (``lua/read_levels.lua``, ``lua/read_fair.lua``) over one
    slot's streams: appends what it read to ``out`` in XREADGROUP's shape, and the streams'
    last entry ids to ``last`` when it read nothing; returns how many entries it read."""
    try:
        reply, tails = await transport.run_script(name, keys, args)
    except ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        for stream in keys:  # recreated; this read finds nothing there, the next one does
            await transport.ensure_group(stream)
        return 0
    read = 0
    for stream, entries in reply:  # a script's reply has flat field lists: as XREADGROUP's
        out.append([stream, [(entry_id, dict(zip(f[::2], f[1::2], strict=True))) for entry_id, f in entries]])
        read += len(entries)
    last.update(zip(keys, tails, strict=False))  # none when it read something
    return read
