"""Every Redis key name the runtime uses, built in one place.

All keys of one queue share the hash tag ``{<namespace>:<queue>}`` so a Lua script touches a
single cluster slot and the runtime works on Redis Cluster unchanged. A queue split into N
partitions has one tag per partition (``{<namespace>:<queue>:<p>}``), so its partitions spread
over the cluster's nodes; its dead-letter stream keeps the queue's own tag.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["CONSUMER_GROUP", "QueueKeys", "outcome_channel", "partition_for", "wake_channel"]

#: One consumer group per stream; workers of one namespace share it.
CONSUMER_GROUP = "dt-workers"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue of one namespace."""

    namespace: str
    queue: str
    partition: int | None = None

    @property
    def tag(self) -> str:
        """The hash tag shared by every key of this queue (partition)."""
        if self.partition is None:
            return f"{{{self.namespace}:{self.queue}}}"
        return f"{{{self.namespace}:{self.queue}:{self.partition}}}"

    @property
    def stream(self) -> str:
        """The stream workers read."""
        return f"dt:{self.tag}:stream"

    @property
    def shadow(self) -> str:
        """The stream of shadow tasks (migration comparisons; results never final)."""
        return f"dt:{self.tag}:shadow"

    @property
    def dlq(self) -> str:
        """The dead-letter stream (one per queue, whatever its partitions)."""
        return f"dt:{{{self.namespace}:{self.queue}}}:dlq"

    def level_stream(self, priority: int) -> str:
        """The stream of one priority level (durable_tasks.flow): level 0 is :attr:`stream`."""
        return self.stream if priority <= 0 else f"{self.stream}:p{priority}"

    def stream_for(self, *, shadow: bool, priority: int = 0) -> str:
        """The stream a delivery of that kind travels on (shadow ignores priority)."""
        return self.shadow if shadow else self.level_stream(priority)

    def dedup(self, task_id: str, generation: int, delivery: int) -> str:
        """The dedup key of one delivery: republishing it adds nothing."""
        return f"dt:{self.tag}:dedup:{task_id}:{generation}:{delivery}"

    def dlq_dedup(self, what: str) -> str:
        """Marks that ``what`` (a delivery, or a malformed entry id) was dead-lettered, so a
        retry after a crash adds no second DLQ entry."""
        return f"dt:{{{self.namespace}:{self.queue}}}:dlqdedup:{what}"


def partition_for(key: str, count: int) -> int | None:
    """The partition a task goes to: a stable hash of its partition key (or id); None when the
    queue is not partitioned. Stable across processes and restarts (CRC-32, not hash())."""
    if count <= 1:
        return None
    return zlib.crc32(key.encode()) % count


def wake_channel(namespace: str) -> str:
    """The pub/sub channel on which committed submits wake the dispatchers of ``namespace``
    where the database has no notification of its own (:mod:`durable_tasks.wakeup`)."""
    return f"dt:{{{namespace}}}:wake"


def outcome_channel(namespace: str) -> str:
    """The pub/sub channel on which settled outcomes of ``namespace`` are announced to result
    waits (:mod:`durable_tasks.outcome`)."""
    return f"dt:{{{namespace}}}:outcomes"
