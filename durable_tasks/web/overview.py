"""The overview's numbers: per queue what the runtime publishes (``App.stats``), task counts by
state (capped), and throughput, failure rate and latency of the last hour per minute.

The last hour is kept in memory, per minute and queue, fed by reading only what finished since
the previous refresh (``readmodel.finished_after`` on ix_dt_tasks_finished): a refresh costs
what finished meanwhile, not the hour. A dashboard started now fills the hour by reading it
once, a few thousand rows per refresh.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
from anyio import to_thread

from .. import readmodel
from ..app import App
from ..records import TaskState
from ..views import QueueStats

__all__ = ["COUNTED_STATES", "Overview", "QueueView", "Snapshot"]

#: The states the overview counts per queue (each count capped at readmodel.COUNT_CAP).
COUNTED_STATES = (
    TaskState.PENDING,
    TaskState.ENQUEUED,
    TaskState.RUNNING,
    TaskState.RETRYING,
    TaskState.FAILED,
    TaskState.DEAD,
)
FAILED_STATES = frozenset({TaskState.FAILED, TaskState.DEAD})
WINDOW = timedelta(hours=1)
RECENT = timedelta(minutes=5)
#: A commit may land a moment after the finished_at it wrote: read only what settled.
SETTLE = timedelta(seconds=2)
RESERVOIR = 256
PAGES_PER_REFRESH = 4


@dataclass(slots=True)
class _Minute:
    done: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    seen: int = 0

    def add(self, state: str, latency_ms: float, rng: random.Random) -> None:
        if state in FAILED_STATES:
            self.failed += 1
        else:
            self.done += 1
        self.seen += 1
        if len(self.latencies_ms) < RESERVOIR:  # a uniform sample of the minute, bounded
            self.latencies_ms.append(latency_ms)
        elif (slot := rng.randrange(self.seen)) < RESERVOIR:
            self.latencies_ms[slot] = latency_ms


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue's row on the overview."""

    name: str
    stats: QueueStats
    counts: dict[str, int]
    per_minute: float
    failure_rate: float | None
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the overview shows at one moment."""

    at: datetime
    queues: list[QueueView]
    series: dict[str, dict[str, list[Any]]]
    cap: int = readmodel.COUNT_CAP


class Overview:
    """Collects snapshots for one App; keeps the last hour of finished tasks per minute."""

    def __init__(self, app: App, *, settle: timedelta = SETTLE) -> None:
        self.app = app
        self.settle = settle
        self._minutes: dict[tuple[str, int], _Minute] = defaultdict(_Minute)
        self._after: tuple[datetime, str] | None = None
        self._rng = random.Random()
        self._lock = anyio.Lock()  # one reader of the buckets at a time (page loads and the live loop)

    @property
    def engine(self) -> Any:
        """The App's read engine, planning keyed (sequential scans priced out on PostgreSQL)."""
        return self.app.runtime.store.read_engine

    def _absorb(self, now: datetime) -> None:
        """Read what finished since the last refresh into the per-minute buckets."""
        namespace = self.app.settings.namespace
        if self._after is None:
            self._after = (now - WINDOW, "")
        for _ in range(PAGES_PER_REFRESH):
            rows = readmodel.finished_after(self.engine, namespace, self._after, until=now - self.settle)
            for r in rows:
                latency = (r.finished_at - r.created_at).total_seconds() * 1000
                self._minutes[(r.queue, int(r.finished_at.timestamp() // 60))].add(r.state, latency, self._rng)
            if rows:
                self._after = (rows[-1].finished_at, rows[-1].id)
            if len(rows) < 5_000:
                break
        oldest = int((now - WINDOW).timestamp() // 60)
        for key in [k for k in self._minutes if k[1] < oldest]:
            del self._minutes[key]

    def _queue_numbers(self, queue: str, now: datetime) -> tuple[float, float | None, float | None, float | None]:
        since = int((now - RECENT).timestamp() // 60)
        recent = [m for (q, minute), m in self._minutes.items() if q == queue and minute >= since]
        done, failed = sum(m.done for m in recent), sum(m.failed for m in recent)
        latencies = [x for m in recent for x in m.latencies_ms]
        rate = failed / (done + failed) if done + failed else None
        minutes = RECENT.total_seconds() / 60
        return (done + failed) / minutes, rate, _percentile(latencies, 0.5), _percentile(latencies, 0.99)

    def _series(self, queues: list[str], now: datetime) -> dict[str, dict[str, list[Any]]]:
        last = int(now.timestamp() // 60)
        minutes = list(range(last - int(WINDOW.total_seconds() // 60) + 1, last + 1))
        out: dict[str, dict[str, list[Any]]] = {}
        for queue in queues:
            buckets = [self._minutes.get((queue, m)) for m in minutes]
            out[queue] = {
                "t": [m * 60 for m in minutes],
                "done": [b.done if b else 0 for b in buckets],
                "failed": [b.failed if b else 0 for b in buckets],
                "p50": [_percentile(b.latencies_ms, 0.5) if b else None for b in buckets],
                "p99": [_percentile(b.latencies_ms, 0.99) if b else None for b in buckets],
            }
        return out

    async def snapshot(self) -> Snapshot:
        """Collect the overview now: Redis and the two database reads run side by side."""
        now = datetime.now(UTC)
        namespace, registered = self.app.settings.namespace, self.app.runtime.queues()
        found: dict[str, Any] = {}

        async def read_stats() -> None:
            found["stats"] = await self.app.stats()

        async def read_counts() -> None:
            states = [s.value for s in COUNTED_STATES]
            found["counts"] = await to_thread.run_sync(
                lambda: readmodel.state_counts(self.engine, namespace, registered, states)
            )

        async def read_finished() -> None:
            async with self._lock:
                await to_thread.run_sync(self._absorb, now)

        async with anyio.create_task_group() as tg:
            for part in (read_stats, read_counts, read_finished):
                tg.start_soon(part)
        stats_by_queue: dict[str, QueueStats] = found["stats"]
        counts = found["counts"]
        queues = sorted(set(stats_by_queue) | set(registered))
        views = []
        for queue in queues:
            per_minute, rate, p50, p99 = self._queue_numbers(queue, now)
            views.append(
                QueueView(
                    queue,
                    stats_by_queue.get(queue) or QueueStats(0, 0.0, 0, 0.0, 0.0, 0),
                    {s.value: counts.get((queue, s.value), 0) for s in COUNTED_STATES},
                    per_minute,
                    rate,
                    p50,
                    p99,
                )
            )
        return Snapshot(now, views, self._series(queues, now))
