"""Outbox → Redis: claim due rows under a lease, publish them in one round trip, record outcomes.

Decisions (what is invalid, how long to back off) come from :mod:`.policy` and the task
registry; this module only moves rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio

from . import failpoints
from .codec import decode_payload, duplicate_key
from .errors import PayloadValidationError
from .outcome import TaskOutcome
from .policy import backoff_delay, pause_after_wait
from .records import TaskState
from .runtime import Runtime, delivery_message
from .store.outbox import ClaimedDelivery, dead_error_type
from .store.queries import UNKNOWN_TASK_ERROR
from .tasks import Task
from .transport.announce import announce_outcomes

__all__ = ["Dispatcher"]

#: Dispatch passes claiming or publishing at once (the claim of the next overlaps the publish
#: of the last).
_PASSES_IN_FLIGHT = 2
#: Published passes waiting for their mark-SENT at once. A pass leaves its lane once published,
#: so the head start below and the mark never hold up the next claim; this bounds the marks
#: (and the claimed rows they keep in memory) when the database is slow.
_SETTLES_IN_FLIGHT = 4

#: After a pass that was not full (a low submit rate), the mark-SENT waits this long, so that
#: the worker the entry woke claims the task row first; otherwise its claim queues behind the
#: mark's lock on the same row. The mark then finds the task RUNNING and leaves it, as it
#: would anyway, and a crash in between only means a deduplicated republish.
_CLAIM_HEAD_START_S = 0.003

#: With submits publishing at commit (:mod:`.commit_publish`), the rows a wake-up announces
#: usually have their entries out already: the pass waits this long after a wake-up
#: (:func:`.policy.pause_after_wait`), leaving the cores to the workers and taking the rows of
#: several submits at once (at 200 submits/s: half the dispatcher's CPU of a 10 ms wait, and a
#: lower submit→start; docs/performance-design.md). A row whose entry did not go out at commit
#: (a rerun, a retry, a resume by a signal, a publish that failed) waits this much longer.
_AFTER_WAKE = timedelta(milliseconds=25)

logger = logging.getLogger(__name__)


class Dispatcher:
    """Moves PENDING outbox rows of one namespace onto their queues' streams."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._settles = anyio.Semaphore(_SETTLES_IN_FLIGHT)
        # Passes publish one at a time, in claim order: a partition key's entries reach its
        # stream in submit order even while two passes overlap.
        self._publishing = anyio.Lock()

    async def dispatch_once(self) -> int:
        """One pass: claim ≤ batch_size due rows and settle each; returns how many were handled."""
        rows = await self._claim()
        if rows:
            await self._dispatch(rows)
        return len(rows)

    async def _claim(self) -> list[ClaimedDelivery]:
        runtime, s = self.runtime, self.runtime.settings
        return await runtime.store.lease_outbox(
            s.namespace, now=runtime.clock(), lease=s.claim_lease, limit=s.batch_size, watermark=s.cutover_watermark
        )

    async def _dispatch(self, rows: list[ClaimedDelivery], published: Callable[[], None] = lambda: None) -> None:
        """Publish and settle ``rows``; ``published()`` is called once they are published,
        before their outcomes are recorded."""
        if failpoints.ENABLED:
            failpoints.hit("dispatch.after_claim")
        with self.runtime.telemetry.dispatch_span([r.traceparent for r in rows]):
            await self._settle(rows, published)

    async def _settle(self, rows: list[ClaimedDelivery], published: Callable[[], None]) -> None:
        runtime, s = self.runtime, self.runtime.settings
        dead: list[tuple[ClaimedDelivery, str]] = []
        held: list[ClaimedDelivery] = []
        unknown: list[ClaimedDelivery] = []
        ready: dict[str, list[ClaimedDelivery]] = defaultdict(list)
        claimed_at = runtime.clock()
        for row in rows:
            task = runtime.registry.get(row.name)
            if task is None:
                # A rolling deploy: the producer knows a task this process does not know yet.
                if claimed_at - row.created_at < s.unknown_task_grace:
                    unknown.append(row)
                else:
                    dead.append((row, f"{_unknown(row)} for longer than unknown_task_grace ({s.unknown_task_grace})"))
                continue
            payload = row.payload_json
            if payload is None:  # over the claim's inline bound: read alone, checked, let go
                payload = await runtime.store.read_payload(row.task_id)
            reason = _invalid_reason(task, row, payload)
            if reason is not None:
                dead.append((row, reason))
            elif runtime.transport_for(row.queue) is None:
                held.append(row)
            else:
                ready[row.queue].append(row)
        sent: list[tuple[ClaimedDelivery, str, int | None]] = []
        failed: list[tuple[ClaimedDelivery, str]] = []
        async with self._publishing:
            for queue, batch in ready.items():
                with runtime.telemetry.publish_span(queue, len(batch)):
                    ok, bad = await self._publish(batch)
                sent += ok
                failed += bad
        if failpoints.ENABLED:
            failpoints.hit("dispatch.after_xadd")
        now = runtime.clock()  # the rows' sent_at: when the publish returned
        published()
        if sent and len(rows) < s.batch_size:
            await anyio.sleep(_CLAIM_HEAD_START_S)
        retry = [(row, now + self._backoff(row.attempts + 1), err) for row, err in failed]
        # An unknown name waits like a failed publish (attempts+1, backoff): not dead until the grace.
        retry_unknown = [(row, now + self._backoff(row.attempts + 1), _unknown(row)) for row in unknown]
        await runtime.store.settle_outbox(
            sent=sent, dead=dead, retry=retry + retry_unknown, held=held, now=now, release_at=now + s.poll_interval
        )
        self._record(sent, dead, retry, held, now)
        self._record_unknown(unknown, now)
        if dead:  # wake the result waits on them (an invalid payload never runs)
            outcomes = [
                TaskOutcome(row.task_id, row.generation, TaskState.DEAD, None, dead_error_type(reason), reason)
                for row, reason in dead
                if not row.shadow
            ]
            await announce_outcomes(
                runtime.transport().client, s.namespace, outcomes, inline_bytes=s.result_inline_bytes
            )

    def _backoff(self, failures: int) -> timedelta:
        s = self.runtime.settings
        return backoff_delay(failures, initial=s.backoff_initial, cap=s.backoff_max, jitter=s.backoff_jitter)

    def _record(
        self,
        sent: list[tuple[ClaimedDelivery, str, int | None]],
        dead: list[tuple[ClaimedDelivery, str]],
        retry: list[tuple[ClaimedDelivery, datetime, str]],
        held: list[ClaimedDelivery],
        now: datetime,
    ) -> None:
        tel = self.runtime.telemetry
        for row, _, _ in sent:
            tel.dispatched.add(1, {"queue": row.queue, "outcome": "sent"})
            tel.dispatch_lag.record((now - row.created_at).total_seconds(), {"queue": row.queue})
        for row, reason in dead:
            tel.dispatched.add(1, {"queue": row.queue, "outcome": "dead"})
            logger.warning("outbox row %s (task %s) is dead: %s", row.outbox_id, row.task_id, reason)
        for row, _, err in retry:
            tel.dispatched.add(1, {"queue": row.queue, "outcome": "retry"})
            logger.warning("publishing task %s failed (attempt %s): %s", row.task_id, row.attempts + 1, err)
        for row in held:
            tel.dispatched.add(1, {"queue": row.queue, "outcome": "held"})

    def _record_unknown(self, rows: list[ClaimedDelivery], now: datetime) -> None:
        """One warning per unknown (task, queue) of the pass, and the metric per row."""
        if not rows:
            return
        tel, grace = self.runtime.telemetry, self.runtime.settings.unknown_task_grace
        by_name: dict[tuple[str, str], list[ClaimedDelivery]] = defaultdict(list)
        for row in rows:
            tel.dispatched.add(1, {"queue": row.queue, "outcome": "unknown_task"})
            by_name[(row.name, row.queue)].append(row)
        for (name, queue), held in by_name.items():
            oldest = min(r.created_at for r in held)
            logger.warning(
                "task name %r (queue %r) is not registered in this process: %d deliveries held PENDING "
                "(deploy the code that defines it here); dead-lettered if still unknown at %s (unknown_task_grace %s)",
                name,
                queue,
                len(held),
                f"{oldest + grace:%Y-%m-%dT%H:%M:%S}Z",
                grace,
            )

    async def _publish(
        self, rows: Sequence[ClaimedDelivery]
    ) -> tuple[list[tuple[ClaimedDelivery, str, int | None]], list[tuple[ClaimedDelivery, str]]]:
        sent: list[tuple[ClaimedDelivery, str, int | None]] = []
        failed: list[tuple[ClaimedDelivery, str]] = []
        if not rows:
            return sent, failed
        partitions = self.runtime.settings.queue_partitions
        messages = [delivery_message(r, partitions) for r in rows]
        try:
            replies: list[str | Exception] = await self.runtime.transport().publish(messages)
        except Exception as exc:  # the whole round trip failed: every row backs off
            replies = [exc] * len(rows)
        for row, msg, reply in zip(rows, messages, replies, strict=True):
            if isinstance(reply, Exception):
                failed.append((row, f"{type(reply).__name__}: {reply}"))
            else:
                sent.append((row, reply, msg.partition))
        return sent, failed

    async def run(self) -> None:
        """Dispatch until cancelled: a full batch loops at once; otherwise sleep until the
        earliest row not due yet is due, the store's wake-up (a NOTIFY on PostgreSQL), or the
        poll interval.

        Two passes overlap: the next batch is claimed while the previous one is published
        and settled (publishing itself stays in claim order).
        """
        s = self.runtime.settings
        waiter = self.runtime.outbox_waiter()
        lanes = anyio.Semaphore(_PASSES_IN_FLIGHT)
        full = False  # the last claim took a whole batch (a backlog: the next one will too)
        head_start = self.head_start()
        try:
            await waiter.listen()  # before the first claim: a row committed after it wakes the wait
            async with anyio.create_task_group() as passes:
                while True:
                    await lanes.acquire()
                    try:
                        rows, sleep = await self._claim_and_sleep(s.poll_interval, ask_due=not full)
                    except Exception:
                        lanes.release()
                        logger.exception("claiming outbox rows failed; retrying after the poll interval")
                        await anyio.sleep(s.poll_interval.total_seconds())
                        continue
                    if rows:
                        passes.start_soon(self._dispatch_then_release, rows, lanes)
                    else:
                        lanes.release()
                    full = len(rows) >= s.batch_size
                    if not full:
                        timeout = sleep if sleep is not None else await self._until_next_due(s.poll_interval)
                        waited_from = anyio.current_time()
                        await waiter.wait(timeout)
                        waited = timedelta(seconds=anyio.current_time() - waited_from)
                        pause = pause_after_wait(head_start=head_start, waited=waited, timeout=timeout)
                        if pause:
                            await anyio.sleep(pause.total_seconds())
        finally:
            await waiter.aclose()

    def head_start(self) -> timedelta | None:
        """How long a pass waits after a wake-up (:func:`.policy.pause_after_wait`): a head
        start for the workers where submits publish their entries at commit, None where the
        dispatcher is their only way out (``publish_on_commit`` off, a runtime without Redis,
        or a Redis Cluster, where a submit publishes only the wake-up)."""
        runtime = self.runtime
        return _AFTER_WAKE if runtime.publishes_at_commit and not runtime.transport().cluster else None

    async def _claim_and_sleep(
        self, longest: timedelta, *, ask_due: bool
    ) -> tuple[list[ClaimedDelivery], timedelta | None]:
        """Claim, and with ``ask_due`` learn how long to sleep after it in the same round trip
        (at a low rate every pass is followed by a wait, and a submit committed while a second
        statement ran would wait for it). None: not asked."""
        if not ask_due:
            return await self._claim(), None
        runtime, s = self.runtime, self.runtime.settings
        now = runtime.clock()
        rows, due = await runtime.store.lease_outbox_and_next_due(
            s.namespace, now=now, lease=s.claim_lease, limit=s.batch_size, watermark=s.cutover_watermark
        )
        return rows, longest if due is None else max(timedelta(0), min(longest, due - now))

    async def _until_next_due(self, longest: timedelta) -> timedelta:
        """How long to sleep: until the earliest row not due yet becomes due (a delayed task, a
        retry's backoff), at most ``longest``; a NOTIFY (a new row) ends the sleep sooner."""
        runtime = self.runtime
        now = runtime.clock()
        try:
            due = await runtime.store.next_due(runtime.settings.namespace, now=now)
        except Exception as exc:  # the claim that follows reports an outage; sleep as before
            logger.debug("reading the next due time failed: %s", exc)
            return longest
        return longest if due is None else max(timedelta(0), min(longest, due - now))

    async def _dispatch_then_release(self, rows: list[ClaimedDelivery], lanes: anyio.Semaphore) -> None:
        """One pass; its lane goes to the next claim once the rows are published (when a
        settle slot is free), its settle slot once they are settled."""
        holding_lane = True
        settling = False

        def published() -> None:
            nonlocal holding_lane, settling
            if self._settles.value > 0:
                self._settles.acquire_nowait()
                settling, holding_lane = True, False
                lanes.release()

        try:
            await self._dispatch(rows, published)
        except Exception:  # the rows keep their lease; they are claimed again once it runs out
            logger.exception("dispatch pass failed; retrying after the poll interval")
            await anyio.sleep(self.runtime.settings.poll_interval.total_seconds())
        finally:
            if settling:
                self._settles.release()
            if holding_lane:
                lanes.release()


def _unknown(row: ClaimedDelivery) -> str:
    return f"{UNKNOWN_TASK_ERROR} {row.name!r} (queue {row.queue!r}): no task is registered under it"


def _invalid_reason(task: Task[Any, Any], row: ClaimedDelivery, payload: str | None) -> str | None:
    """Why a row's payload cannot run as ``task`` (it no longer validates, or JSON from outside
    ``App.submit`` names a key twice), or None. A payload of None is a task row gone since the
    lease: the worker finds no task and drops it."""
    if payload is None:  # pragma: no cover - the lease holds the outbox row, not its task's
        return None
    if row.foreign_json and (key := duplicate_key(payload)) is not None:
        return (
            f"payload of task {row.name!r} names the key {key!r} twice in one object, which readers "
            "resolve differently; submit each key once"
        )
    try:
        decode_payload(task.payload_adapter, payload, task=row.name)
    except PayloadValidationError as exc:
        return str(exc)
    return None
