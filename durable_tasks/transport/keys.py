"""Every Redis key name the runtime uses, built in one place.

All keys of one queue share the hash tag ``{<namespace>:<queue>}`` so a Lua script touches a
single cluster slot and the runtime works on Redis Cluster unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONSUMER_GROUP", "QueueKeys"]

#: One consumer group per stream; workers of one namespace share it.
CONSUMER_GROUP = "dt-workers"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue of one namespace."""

    namespace: str
    queue: str

    @property
    def tag(self) -> str:
        """The hash tag shared by every key of this queue."""
        return f"{{{self.namespace}:{self.queue}}}"

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
        """The dead-letter stream."""
        return f"dt:{self.tag}:dlq"

    def stream_for(self, *, shadow: bool) -> str:
        """The stream a delivery of that kind travels on."""
        return self.shadow if shadow else self.stream

    def dedup(self, task_id: str, generation: int, delivery: int) -> str:
        """The dedup key of one delivery: republishing it adds nothing."""
        return f"dt:{self.tag}:dedup:{task_id}:{generation}:{delivery}"

    def dlq_dedup(self, what: str) -> str:
        """Marks that ``what`` (a delivery, or a malformed entry id) was dead-lettered, so a
        retry after a crash adds no second DLQ entry."""
        return f"dt:{self.tag}:dlqdedup:{what}"
