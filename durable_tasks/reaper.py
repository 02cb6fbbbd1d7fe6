"""Recovery: reclaim entries whose worker vanished, dead-letter poison, reconcile lost
deliveries, trim acknowledged entries.

Every decision comes from :func:`.policy.decide_reap`; every redelivery goes through the
database first (a new outbox row), then the old entry is acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import anyio
import sqlalchemy as sa

from . import failpoints
from .codec import decode_payload
from .dead_letters import forget_rerun_oldest
from .errors import PayloadValidationError, TaskDeadLetteredError
from .outcome import TaskOutcome
from .policy import ReapAction, TaskLeaseView, decide_reap
from .records import TaskState
from .runtime import Runtime
from .stats import queue_stats
from .store.recovery import DeadTask, ReconcileCursor, UnconfirmedDelivery
from .store.retention import PruneReport, pause_after
from .tasks import TaskContext, session_hooks
from .transport.announce import announce_outcomes
from .transport.messages import Delivery, MalformedEntryError

__all__ = ["ReapReport", "Reaper", "redeliver"]

logger = logging.getLogger(__name__)

REAPER_CONSUMER = "dt-reaper"
#: Pages one pass reads at most (of a PEL, of the reconciler's unconfirmed deliveries), and
#: entries settled at once.
_MAX_PAGES = 1000
#: Pages of the reconciler's walk in one pass that found no entry lost: a backlog not read yet
#: is walked this many pages a pass, not all at once every pass (where pages find lost
#: entries, as after a Redis restart, the pass goes on up to _MAX_PAGES).
_RECONCILE_CLEAN_PAGES = 10
_SETTLING = 8
#: Rows per prune transaction, and transactions per retention pass (bounded locks and passes).
_PRUNE_BATCH = 1000
_PRUNE_BATCHES = 20


@dataclass(slots=True)
class ReapReport:
    """What one reaper pass did."""

    redelivered: int = 0
    dead_lettered: int = 0
    acked_stale: int = 0
    kept: int = 0
    reconciled: int = 0
    trimmed: int = 0
    #: DLQ entries deleted because their task was rerun since (:mod:`.dead_letters`).
    forgotten_dead_letters: int = 0
    deleted_entries: list[str] = field(default_factory=list)


async def redeliver(
    runtime: Runtime,
    d: Delivery | UnconfirmedDelivery,
    reason: str,
    *,
    now: datetime,
    lost: bool,
    due: datetime | None = None,
) -> bool:
    """Supersede delivery ``d`` of a task with a new one through the outbox (due at ``due``,
    default now); False if ``d`` is stale. ``lost`` counts it against ``max_deliveries`` (a
    worker died holding it), as a handed-back or vanished entry is not."""
    return await runtime.store.redeliver(
        runtime.settings.namespace,
        task_id=d.task_id,
        generation=d.generation,
        delivery=d.delivery,
        now=now,
        reason=reason,
        count_reclaim=lost,
        due=due,
    )


class Reaper:
    """Scans the PELs and the database of one namespace for work a crash left behind."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        #: Where the reconciler's walk goes on (None: from the start).
        self._reconcile_after: ReconcileCursor | None = None

    async def reap_once(self) -> ReapReport:
        """One pass over every queue: pending entries, then reconciliation, then trimming."""
        report = ReapReport()
        transport = self.runtime.transport()
        for queue in self.runtime.queues():
            for stream, _, _ in transport.streams(queue):
                await self._scan_pending(queue, stream, report)
                report.trimmed += await transport.trim(stream)
            report.forgotten_dead_letters += await forget_rerun_oldest(self.runtime, queue)
        await self._reconcile(report)
        await queue_stats(self.runtime)  # refreshes the observable gauges (PEL, delays, DLQ length)
        return report

    async def _scan_pending(self, queue: str, stream: str, report: ReapReport) -> None:
        runtime, s = self.runtime, self.runtime.settings
        transport = runtime.transport()
        min_idle = min(s.lease_timeout, s.visibility_timeout)
        cursor = "0-0"
        # The whole PEL in one pass, a page of reaper_batch at a time: a worker killed with
        # thousands of entries is recovered in one pass, not in one pass per page, and each
        # page's round trips and transaction are paid once for many entries.
        for _ in range(_MAX_PAGES):
            page = await transport.autoclaim(
                stream, REAPER_CONSUMER, min_idle=min_idle, cursor=cursor, count=s.reaper_batch
            )
            report.deleted_entries += page.deleted
            parsed: list[tuple[str, Delivery]] = []
            for entry_id, fields in page.entries:
                try:
                    parsed.append((entry_id, transport.parse(fields, stream)))
                except MalformedEntryError as exc:
                    await transport.dead_letter_malformed(queue, stream, entry_id, fields, str(exc))
                    report.dead_lettered += 1
            task_ids = [d.task_id for _, d in parsed]
            views = await runtime.store.lease_views(s.namespace, task_ids)
            now = runtime.clock()
            lost = [
                (entry_id, d)
                for entry_id, d in parsed
                if self._decide(entry_id, d, views.get(d.task_id), min_idle, now) is ReapAction.REDELIVER
            ]
            await self._redeliver_lost(queue, stream, lost, now, report)
            redelivered = {entry_id for entry_id, _ in lost}
            settling = anyio.CapacityLimiter(_SETTLING)  # each entry is its own transaction: overlap some
            errors: list[Exception] = []
            async with anyio.create_task_group() as tg:
                for entry_id, d in parsed:
                    if entry_id in redelivered:
                        continue
                    settle = partial(self._settle_entry, queue, stream, entry_id, d, views.get(d.task_id), min_idle)
                    tg.start_soon(_limited, settling, settle, report, errors)
            if errors:
                # The pass stops as it would settling one entry after another, with the error
                # itself (not a group of one): callers of reap_once catch what the store raises.
                for later in errors[1:]:
                    logger.error("settling another entry of %s failed too", stream, exc_info=later)
                raise errors[0]
            cursor = page.cursor
            if cursor == "0-0" or not page.entries:
                break

    def _decide(
        self, entry_id: str, d: Delivery, view: TaskLeaseView | None, idle: timedelta, now: datetime
    ) -> ReapAction:
        s = self.runtime.settings
        age = timedelta(milliseconds=max(0, int(now.timestamp() * 1000) - int(entry_id.split("-")[0])))
        return decide_reap(
            entry_generation=d.generation,
            entry_delivery=d.delivery,
            idle=idle if view else age,
            task=view,
            now=now,
            lease_timeout=s.lease_timeout,
            visibility_timeout=s.visibility_timeout,
            max_deliveries=s.max_deliveries,
        )

    async def _redeliver_lost(
        self, queue: str, stream: str, lost: Sequence[tuple[str, Delivery]], now: datetime, report: ReapReport
    ) -> None:
        """Redeliver the entries of dead workers, all in one transaction, then acknowledge those
        redelivered. A refused one stays pending for the next pass: its worker may have renewed
        the lease since this pass read it (it holds the entry), or the task moved on (stale)."""
        if not lost:
            return
        runtime = self.runtime
        reason = "worker lost: lease expired, entry reclaimed"
        keys = [(d.task_id, d.generation, d.delivery) for _, d in lost]
        flags = await runtime.store.redeliver_lost(runtime.settings.namespace, keys, now=now, reason=reason)
        redelivered = [entry_id for (entry_id, _), done in zip(lost, flags, strict=True) if done]
        for (_, d), done in zip(lost, flags, strict=True):
            report.redelivered += int(done)
            if failpoints.ENABLED:
                failpoints.hit("reaper.after_reclaim")
            if done:
                logger.info("redelivered task %s (gen %s, delivery %s)", d.task_id, d.generation, d.delivery + 1)
                runtime.telemetry.reclaimed.add(1, {"queue": queue, "reason": "worker_lost"})
                runtime.telemetry.task_event(
                    "reclaim", d.traceparent, queue, {"durable_tasks.task.id": d.task_id, "reason": "lease expired"}
                )
        await runtime.transport().ack(stream, redelivered)

    async def _settle_entry(
        self,
        queue: str,
        stream: str,
        entry_id: str,
        d: Delivery,
        view: TaskLeaseView | None,
        idle: timedelta,
        report: ReapReport,
    ) -> None:
        runtime, s = self.runtime, self.runtime.settings
        transport = runtime.transport()
        now = runtime.clock()
        action = self._decide(entry_id, d, view, idle, now)
        if action is ReapAction.KEEP:
            report.kept += 1
            return
        if action is ReapAction.REDELIVER:
            await self._redeliver_lost(queue, stream, [(entry_id, d)], now, report)
            return
        if action is ReapAction.DEAD_LETTER:
            reason = (
                f"lost {s.max_deliveries} deliveries (max_deliveries)"
                if view
                else f"no task row for {s.visibility_timeout} (visibility_timeout)"
            )
            done = view is None or await runtime.store.dead_letter_task(
                s.namespace,
                task_id=d.task_id,
                generation=d.generation,
                delivery=d.delivery,
                now=now,
                reason=reason,
                on_dead=partial(self._failure_hooks, reason),
            )
            if not done:  # refused (a lease renewed since the view, or the task moved on): next pass decides
                return
            await self._publish_dead_letter(queue, entry_id, d, reason)
            if view is not None:  # wake the result waits on it
                dead = TaskOutcome(d.task_id, d.generation, TaskState.DEAD, None, "DeadLettered", reason)
                await announce_outcomes(transport.client, s.namespace, [dead], inline_bytes=s.result_inline_bytes)
            report.dead_lettered += 1
            runtime.telemetry.dead_lettered.add(1, {"queue": queue})
            runtime.telemetry.task_event(
                "dead_letter", d.traceparent, queue, {"durable_tasks.task.id": d.task_id, "reason": reason}
            )
        else:
            if (
                view is not None
                and view.state == TaskState.DEAD
                and (view.generation, view.delivery) == (d.generation, d.delivery)
            ):
                # Dead in the database but maybe not yet in the DLQ stream (a crash between the
                # two): publishing again is deduplicated.
                await self._publish_dead_letter(queue, entry_id, d, "dead-lettered")
            report.acked_stale += 1
        await transport.ack(stream, [entry_id])

    def _failure_hooks(self, reason: str, conn: sa.Connection, row: DeadTask) -> None:
        """Run the task's ``on_failure`` hooks for a task the reaper dead-letters."""
        task = self.runtime.registry.get(row.name)
        if task is None or not task.failure_hooks:
            return
        try:
            payload = decode_payload(task.payload_adapter, row.payload, task=row.name)
        except PayloadValidationError:
            payload = None
        ctx: TaskContext[Any] = TaskContext(
            task_id=row.id,
            name=row.name,
            queue=row.queue,
            generation=row.generation,
            attempt=row.attempt,
            delivery=0,
            idempotency_key=row.idempotency_key,
            payload=payload,
        )
        run = session_hooks(task.failure_hooks, ctx, TaskDeadLetteredError(reason))
        if run is not None:
            run(conn)

    async def _publish_dead_letter(self, queue: str, entry_id: str, d: Delivery, reason: str) -> None:
        await self.runtime.transport().dead_letter(
            queue,
            f"{d.task_id}:{d.generation}:{d.delivery}",
            {
                "t": d.task_id,
                "g": str(d.generation),
                "d": str(d.delivery),
                "n": d.name,
                "dt_reason": reason,
                "dt_entry": entry_id,
            },
        )

    async def _reconcile(self, report: ReapReport) -> None:
        """Tasks the database says were sent but whose entry Redis no longer has: send again.

        A walk in (enqueued_at, id) order, a page after another, each page's lost entries in
        one transaction, as the PEL scan redelivers a dead worker's. A page whose entries all
        exist (a backlog not read yet) does not end the walk: the lost entries behind it are
        reached. A pass reads at most _MAX_PAGES pages, of which _RECONCILE_CLEAN_PAGES found
        nothing lost; the next pass goes on from there, and a short page (the end) starts the
        walk over."""
        runtime, s = self.runtime, self.runtime.settings
        transport = runtime.transport()
        clean = 0
        for _ in range(_MAX_PAGES):
            now = runtime.clock()
            page = await runtime.store.unconfirmed_deliveries(
                s.namespace, now=now, grace=s.reconcile_grace, limit=s.reaper_batch, after=self._reconcile_after
            )
            by_stream: dict[str, list[UnconfirmedDelivery]] = defaultdict(list)
            for u in page.deliveries:
                by_stream[transport.stream_of(u.queue, u.partition, shadow=u.shadow, priority=u.priority)].append(u)
            lost: list[tuple[str, UnconfirmedDelivery]] = []
            for stream, items in by_stream.items():
                exists = await transport.entries_exist(stream, [u.stream_id for u in items])
                lost += [(stream, u) for u, present in zip(items, exists, strict=True) if not present]
            keys = [(u.task_id, u.generation, u.delivery) for _, u in lost]
            flags = (
                await runtime.store.redeliver_lost(
                    s.namespace, keys, now=now, reason="stream entry lost by Redis", count_reclaim=False
                )
                if keys
                else []
            )
            for (stream, u), done in zip(lost, flags, strict=True):
                if done:
                    report.reconciled += 1
                    runtime.telemetry.reclaimed.add(1, {"queue": u.queue, "reason": "entry_lost"})
                    logger.warning("task %s: entry %s gone from %s, dispatching again", u.task_id, u.stream_id, stream)
            self._reconcile_after = page.cursor
            clean += not lost
            if page.cursor is None or clean >= _RECONCILE_CLEAN_PAGES:
                return

    async def prune_once(self) -> PruneReport:
        """Delete finished work older than the ``retention`` setting, up to a bounded number of
        batches (nothing when it is off). One batch per thread hop, and the store's pace
        (``prune_duty``, down to ``retention_min_rate``) kept by an async pause after each full
        one: a reaper that is stopped waits for the batch in progress, never for a pause."""
        runtime, s = self.runtime, self.runtime.settings
        report = PruneReport()
        if s.retention is None:
            return report
        before = runtime.clock() - s.retention
        store = runtime.store
        batch = partial(store.prune, s.namespace, before=before, batch=_PRUNE_BATCH, max_batches=1, paced=False)
        while report.batches < _PRUNE_BATCHES:
            began = time.perf_counter()
            report.add(await anyio.to_thread.run_sync(batch))
            if not report.more:
                break
            held = time.perf_counter() - began
            await anyio.sleep(pause_after(held, store.prune_duty, rows=report.last_rows, min_rate=s.retention_min_rate))
        return report

    async def _retain(self) -> None:
        """Prune beside the reaping (a long prune never delays a reclaim); while a pass leaves
        more behind, the next starts at once."""
        while True:
            try:
                caught_up = not (await self.prune_once()).more
            except Exception:
                logger.exception("retention pass failed; trying again next interval")
                caught_up = True
            if caught_up:
                await anyio.sleep(self.runtime.settings.reaper_interval.total_seconds())

    async def run(self) -> None:
        """Reap every ``reaper_interval`` until cancelled, and prune with ``retention`` set."""
        async with anyio.create_task_group() as tg:
            if self.runtime.settings.retention is not None:
                tg.start_soon(self._retain)
            while True:
                try:
                    await self.reap_once()
                except Exception:
                    logger.exception("reaper pass failed; trying again next interval")
                await anyio.sleep(self.runtime.settings.reaper_interval.total_seconds())


async def _limited(
    limiter: anyio.CapacityLimiter,
    settle: Callable[[ReapReport], Awaitable[None]],
    report: ReapReport,
    errors: list[Exception],
) -> None:
    """Settle one entry; an error is kept for the pass to raise, so that it neither cancels
    the entries settling beside it (each its own transaction) nor reaches the caller wrapped."""
    async with limiter:
        try:
            await settle(report)
        except Exception as exc:
            errors.append(exc)
