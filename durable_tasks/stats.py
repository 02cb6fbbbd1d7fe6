"""Per-queue statistics: what the database and Redis say about each queue right now.

The reaper refreshes them every pass (the observable gauges read the last ones); ``App.stats``
and the CLI's ``status`` ask for them on demand.
"""

from __future__ import annotations

from .runtime import Runtime
from .views import QueueStats

__all__ = ["queue_stats"]


async def queue_stats(runtime: Runtime) -> dict[str, QueueStats]:
    """Per queue: outbox backlog and oldest age, PEL size, queue delay, oldest pending age,
    stream lag, DLQ length. Raises SQLAlchemy's or redis' errors when a server is unreachable."""
    now = runtime.clock()
    backlogs = await runtime.store.queue_backlogs(runtime.settings.namespace)
    transport = runtime.transport()
    out: dict[str, QueueStats] = {}
    for queue in sorted(set(runtime.queues()) | set(backlogs)):
        b = backlogs.get(queue)
        snap = await transport.snapshot(queue, now_ms=int(now.timestamp() * 1000))
        out[queue] = QueueStats(
            outbox_backlog=b.outbox_backlog if b else 0,
            outbox_oldest_age_s=(now - b.outbox_oldest).total_seconds() if b and b.outbox_oldest else 0.0,
            pel_size=snap.pel_size,
            queue_delay_s=(now - b.oldest_enqueued).total_seconds() if b and b.oldest_enqueued else 0.0,
            oldest_pending_age_s=snap.oldest_pending_age_s,
            dlq_length=snap.dlq_length,
            stream_lag=snap.stream_lag,
            unknown_held=b.unknown_held if b else 0,
        )
    runtime.latest_stats = out
    return out
