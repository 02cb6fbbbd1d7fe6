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
    stream lag, DLQ length, running tasks. Raises SQLAlchemy's or redis' errors when a server
    is unreachable.

    Whether any work is left is the database's answer, read in one statement after Redis:
    every task neither final nor waiting is then a pending outbox row, an ENQUEUED task or a
    RUNNING one, in one snapshot (:func:`.store.queries.queue_backlogs`), and a worker commits
    what a task leads to (a retry, a child, a parent's resume) in the transaction that ends
    it. So a caller waiting for every count to reach zero cannot stop while a task is on its
    way, whichever way it moves between the reads: a task the dispatcher sends and a worker
    claims after Redis was read is RUNNING in the database, and one that ends meanwhile has
    its follow-up committed. Redis' numbers (PEL, lag, DLQ) say where the entries are. (A
    queue known only from the database, registered by no task here, is read after it.)"""
    now = runtime.clock()
    now_ms = int(now.timestamp() * 1000)
    transport = runtime.transport()
    snaps = {queue: await transport.snapshot(queue, now_ms=now_ms) for queue in sorted(set(runtime.queues()))}
    backlogs = await runtime.store.queue_backlogs(runtime.settings.namespace)
    for queue in sorted(set(backlogs) - set(snaps)):
        snaps[queue] = await transport.snapshot(queue, now_ms=now_ms)
    out: dict[str, QueueStats] = {}
    for queue in sorted(snaps):
        b, snap = backlogs.get(queue), snaps[queue]
        out[queue] = QueueStats(
            outbox_backlog=b.outbox_backlog if b else 0,
            outbox_oldest_age_s=(now - b.outbox_oldest).total_seconds() if b and b.outbox_oldest else 0.0,
            pel_size=snap.pel_size,
            queue_delay_s=(now - b.oldest_enqueued).total_seconds() if b and b.oldest_enqueued else 0.0,
            oldest_pending_age_s=snap.oldest_pending_age_s,
            dlq_length=snap.dlq_length,
            stream_lag=snap.stream_lag,
            unknown_held=b.unknown_held if b else 0,
            running=b.running if b else 0,
        )
    runtime.latest_stats = out
    return out
