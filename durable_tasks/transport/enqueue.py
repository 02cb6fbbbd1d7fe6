"""What a publish sends: the enqueue script's calls for a batch of deliveries.

Pure, so that the two publishers send the same thing: the dispatcher's (async, after its
lease) and a submit's at commit (sync, :mod:`durable_tasks.commit_publish`). A delivery both
publish lands once, because its dedup key, its stream and its fields do not depend on who
sends it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .keys import QueueKeys, partition_for
from .messages import OutgoingMessage

__all__ = ["PUBLISH_CHUNK", "EnqueueCalls", "enqueue_calls", "entry_json", "level_for", "level_of", "outgoing"]

#: Deliveries per enqueue-script call: bounds how long one call holds the Redis server.
PUBLISH_CHUNK = 128

_FIELDS_ENCODER = json.JSONEncoder(separators=(",", ":"))


def outgoing(
    *,
    queue: str,
    task_id: str,
    generation: int,
    delivery: int,
    name: str,
    traceparent: str | None,
    shadow: bool,
    partition_key: str | None,
    partitions: Mapping[str, int],
    priority: int | None,
    concurrency_key: str | None,
) -> OutgoingMessage:
    """One delivery of a task, on the partition its partition key (else its id) hashes to."""
    return OutgoingMessage(
        queue,
        task_id,
        generation,
        delivery,
        name,
        traceparent,
        shadow,
        partition=partition_for(partition_key or task_id, partitions.get(queue, 1)),
        priority=priority or 0,
        concurrency_key=concurrency_key,
    )


def level_for(queue: str, priority: int | None, prioritized: Callable[[str], bool]) -> int:
    """The level stream a delivery of ``priority`` on ``queue`` goes to: its priority on a
    prioritized queue, else 0 (the publish's choice, and where the reconciler looks)."""
    return priority if priority and prioritized(queue) else 0


def level_of(msg: OutgoingMessage, prioritized: Callable[[str], bool]) -> int:
    """:func:`level_for` of a delivery (a level-0 one, the usual case, costs one attribute read)."""
    return level_for(msg.queue, msg.priority, prioritized) if msg.priority else 0


@dataclass(frozen=True, slots=True)
class EnqueueCalls:
    """The ``enqueue_batch.lua`` calls of one publish: (keys, args) per call, and which
    messages each call carries."""

    calls: list[tuple[list[str], list[str | int]]]
    chunks: list[list[int]]
    size: int

    def entry_ids(self, replies: Sequence[Any]) -> list[str | Exception]:
        """One entry id or one error per message, from the calls' replies (a call that failed
        fails every delivery it carried)."""
        out: list[str | Exception] = [RuntimeError("not published")] * self.size
        for chunk, reply in zip(self.chunks, replies, strict=True):
            for position, i in enumerate(chunk):
                out[i] = reply if isinstance(reply, Exception) else _text(reply[position])
        return out


def enqueue_calls(
    messages: Sequence[OutgoingMessage],
    *,
    namespace: str,
    dedup_ttl_ms: int,
    signing_key: bytes | None,
    prioritized: Callable[[str], bool],
) -> EnqueueCalls:
    """One script call per stream (and per ``PUBLISH_CHUNK`` deliveries) for ``messages``."""
    by_stream: dict[str, list[int]] = {}
    dedup_keys: list[str] = []
    entries: list[str] = []
    for i, msg in enumerate(messages):
        keys = QueueKeys(namespace, msg.queue, msg.partition)
        stream = keys.stream_for(shadow=msg.shadow, priority=level_of(msg, prioritized))
        by_stream.setdefault(stream, []).append(i)
        dedup_keys.append(keys.dedup(msg.task_id, msg.generation, msg.delivery))
        entries.append(entry_json(msg.fields(stream, signing_key)))
    chunks: list[list[int]] = []
    calls: list[tuple[list[str], list[str | int]]] = []
    for stream, indices in by_stream.items():
        for lo in range(0, len(indices), PUBLISH_CHUNK):
            chunk = indices[lo : lo + PUBLISH_CHUNK]
            chunks.append(chunk)
            calls.append(([stream, *(dedup_keys[i] for i in chunk)], [dedup_ttl_ms, *(entries[i] for i in chunk)]))
    return EnqueueCalls(calls, chunks, len(messages))


def entry_json(fields: Mapping[str, str]) -> str:
    """An entry's fields as enqueue_batch.lua takes them: one JSON array, field, value, ..."""
    return _FIELDS_ENCODER.encode([part for pair in fields.items() for part in pair])


def _text(reply: Any) -> str:
    """An entry id as a client returns it (bytes without ``decode_responses``)."""
    return reply.decode() if isinstance(reply, bytes) else str(reply)
