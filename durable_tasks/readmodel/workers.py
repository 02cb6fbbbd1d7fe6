"""Who holds what: running tasks per worker (the database's view) and a queue's stream
consumers (Redis's view, XINFO CONSUMERS)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from redis.exceptions import ResponseError

from ..records import TaskState, tasks_table
from ..state_indexes import state_index
from ..transport.keys import CONSUMER_GROUP
from ..transport.streams import RedisStreamsTransport
from .paging import utc

__all__ = ["ConsumerInfo", "WorkerLoad", "running_by_worker", "stream_consumers"]

t = tasks_table.c


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What the database says one worker holds: its running tasks and their leases."""

    worker_id: str
    running: int
    oldest_started_at: datetime | None
    earliest_lease_expiry: datetime | None
    latest_lease_expiry: datetime | None


def running_by_worker(engine: sa.Engine, namespace: str) -> list[WorkerLoad]:
    """RUNNING tasks grouped by worker (ix_dt_tasks_state: reads the running tasks only)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                t.worker_id,
                sa.func.count().label("n"),
                sa.func.min(t.started_at).label("oldest"),
                sa.func.min(t.lease_expires_at).label("lease_min"),
                sa.func.max(t.lease_expires_at).label("lease_max"),
            )
            .where(t.namespace == namespace, t.state == TaskState.RUNNING, state_index())
            .group_by(t.worker_id)
            .order_by(t.worker_id)
        ).all()
    return [WorkerLoad(r.worker_id or "?", int(r.n), utc(r.oldest), utc(r.lease_min), utc(r.lease_max)) for r in rows]


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer of a queue's stream, as XINFO CONSUMERS reports it."""

    stream: str
    name: str
    pending: int
    idle_ms: int
    inactive_ms: int | None


async def stream_consumers(transport: RedisStreamsTransport, queue: str) -> list[ConsumerInfo]:
    """The consumers of every stream (and partition) of ``queue`` in the workers' group."""
    found: list[ConsumerInfo] = []
    for stream, _shadow, _partition in transport.streams(queue):
        if not await transport.client.exists(stream):
            continue
        try:
            consumers: Any = await transport.client.xinfo_consumers(stream, CONSUMER_GROUP)
        except ResponseError:  # NOGROUP: no worker ever started on this stream
            continue
        for c in consumers:
            inactive = c.get("inactive")
            found.append(
                ConsumerInfo(
                    stream,
                    str(c["name"]),
                    int(c.get("pending") or 0),
                    int(c.get("idle") or 0),
                    int(inactive) if inactive is not None else None,
                )
            )
    return found
