"""A worker that reads a task it does not know leaves it for one that does.

In a rolling deploy, a dispatcher of the new release publishes a task that workers of the
previous release read too (they share the queue's consumer group). Such a worker claims
nothing: no attempt is spent, no handler is looked for. It supersedes the delivery with a new
one through the outbox, due after a backoff (the reaper's redelivery, not counted as a loss),
and acknowledges the entry; the dispatcher publishes the new delivery, which another worker
of the group may read. The worker never dead-letters the task: the dispatcher that published it
knows the name, so some release does. While no worker knows it, it goes round once per
backoff (at most ``backoff_max``), with a warning each time.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from .policy import backoff_delay
from .reaper import redeliver
from .runtime import Runtime
from .transport.messages import Delivery, StreamEntry

__all__ = ["hand_back"]

logger = logging.getLogger(__name__)


async def hand_back(
    runtime: Runtime, worker_id: str, unknown: Sequence[tuple[StreamEntry, Delivery]], done: Callable[[bool], None]
) -> None:
    """Pass deliveries of tasks not registered here back through the outbox, then ack them.

    ``done(settled)`` is called once per entry: False when the database or Redis could not be
    reached (the entry stays pending; the reaper redelivers it later).
    """
    if not unknown:
        return
    s, now = runtime.settings, runtime.clock()
    by_name: dict[tuple[str, str], int] = defaultdict(int)
    handed: list[StreamEntry] = []
    for entry, d in unknown:
        due = now + backoff_delay(d.delivery + 1, initial=s.backoff_initial, cap=s.backoff_max, jitter=s.backoff_jitter)
        try:
            await redeliver(
                runtime, d, f"worker {worker_id} does not register task {d.name!r}", now=now, lost=False, due=due
            )
        except SQLAlchemyError as exc:
            logger.warning("cannot hand task %s back (%s); its entry stays pending", d.task_id, exc)
            done(False)
            continue
        handed.append(entry)
        by_name[(d.name, entry.queue)] += 1
        runtime.telemetry.executions.add(1, {"queue": entry.queue, "task": d.name, "outcome": "unknown_task"})
    for (name, queue), n in by_name.items():
        logger.warning(
            "task name %r (queue %r) is not registered in worker %s: %d deliveries left for a worker that "
            "knows it (deploy the code that defines it)",
            name,
            queue,
            worker_id,
            n,
        )
    acked = False
    by_stream: dict[str, list[str]] = defaultdict(list)
    for entry in handed:
        by_stream[entry.stream].append(entry.entry_id)
    try:
        transport = runtime.transport()
        for stream, ids in by_stream.items():
            await transport.ack(stream, ids)
        acked = True
    except RedisError as exc:  # pending: the reaper finds the delivery superseded and acks it
        logger.warning("acknowledging %d handed-back entries failed: %s", len(handed), exc)
    for _ in handed:
        done(acked)
