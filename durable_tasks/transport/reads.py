"""Reads of several streams that take no more entries than asked.

XREADGROUP's COUNT bounds each stream it names, not the read: with COUNT 10 a worker reading
two queues could get 20 entries, and start more attempts than it has slots. So a read of
several queues, partitions or priority levels takes its entries in one script
(``lua/read_fair.lua``: an even share per stream; ``lua/read_levels.lua``: highest level
first), which never blocks. When that finds nothing, a plain XREAD blocks from each stream's
last entry id (the script names them): it reads nothing for the consumer group and returns as
soon as one of the streams gets a new entry, which a second take then reads. An entry added
after the script ran has a higher id than the one it named, so no wake-up is missed.

A read of one queue's one partition names its main and its shadow stream, and the shadow
stream holds entries only while a queue moves to another Redis; it blocks on XREADGROUP itself
(one round trip per wake-up, the latency path), as the transport's plain read does.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any, Protocol

from .keys import CONSUMER_GROUP
from .levels import LevelReader, read_by_level, run_read_script

__all__ = ["read_counted"]


class CountedReader(LevelReader, Protocol):
    """What a counted read needs of the transport (RedisStreamsTransport)."""

    client: Any


async def read_counted(
    transport: CountedReader, streams: list[str], consumer: str, count: int, block: timedelta, *, prioritized: bool
) -> list[Any]:
    """At most ``count`` entries of ``streams``, waiting up to ``block`` for one; the reply
    has XREADGROUP's shape. Not for a cluster, whose reads go slot by slot."""
    take = partial(read_by_level if prioritized else _read_fair, transport, streams, consumer, count)
    reply, last = await take()
    if reply or not last:  # something read, or a consumer group was recreated: read again
        return reply
    woke = await transport.client.xread(last, count=1, block=max(1, int(block.total_seconds() * 1000)))
    if not woke:
        return []
    reply, _ = await take()
    return reply


async def _read_fair(
    transport: CountedReader, streams: list[str], consumer: str, count: int
) -> tuple[list[Any], dict[str, str]]:
    out: list[Any] = []
    last: dict[str, str] = {}
    await run_read_script(transport, "read_fair", streams, [CONSUMER_GROUP, consumer, count], out, last)
    return out, last
