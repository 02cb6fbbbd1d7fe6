"""Consumer loop: read entries, take the execution fence (a batch per read), run, commit
fenced (grouped), acknowledge (grouped).

An entry is acknowledged only after the database has recorded what happened to it (result,
failure, or "stale"): a worker that cannot reach the database leaves the entry in the PEL
for the reaper.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import uuid
from collections import defaultdict
from collections.abc import Coroutine, Iterable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from . import failpoints
from .attempt import ExecutionOutcome, LeaseKeeper, run_attempt
from .batching import Coalescer
from .handler_threads import HandlerThreads
from .isolation import IsolationGate
from .outcome import TaskOutcome
from .payload_memory import PayloadMemory
from .policy import suspect_group_limit
from .records import TaskState
from .runtime import Runtime
from .starts import StartRecorder
from .store.execution import ClaimRefused, ClaimRequest, ExecutionClaim
from .store.results import CommitOutcome
from .telemetry import link_to, traceparent_of
from .transport.announce import announcement
from .transport.keys import CONSUMER_GROUP
from .transport.messages import Delivery, MalformedEntryError, StreamEntry
from .unknown import hand_back
from .worker_commit import PendingCommit
from .worker_counters import WorkerCounters

__all__ = ["Worker", "WorkerCounters"]

logger = logging.getLogger(__name__)


_ACKED_OUTCOMES = (CommitOutcome.COMMITTED, CommitOutcome.FENCED_OUT)
#: read batches being claimed at once (see Worker._read_loop)
_INTAKES_IN_FLIGHT = 2


class Worker:
    """Runs the tasks of some queues of one App, ``concurrency`` at a time."""

    def __init__(self, runtime: Runtime, *, queues: list[str] | None = None, concurrency: int | None = None) -> None:
        self.runtime = runtime
        self.queues = queues or runtime.queues()
        self.concurrency = concurrency or runtime.settings.concurrency
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.counters = WorkerCounters()
        self._in_flight = 0
        self._stopping = anyio.Event()
        self._slot_freed = anyio.Event()
        s = runtime.settings
        self._committer: Coalescer[PendingCommit] = Coalescer(
            self._commit, max_batch=s.commit_batch_max, window=s.commit_window, concurrency=2
        )
        self._acker: Coalescer[tuple[str, str]] = Coalescer(self._ack_now, max_batch=1000)
        self._leases = LeaseKeeper(runtime)
        # Sync handlers' own threads: never anyio's pool, where claims, commits and leases run.
        self._handler_threads = HandlerThreads(min(self.concurrency, s.handler_threads or self.concurrency))
        self._gate = IsolationGate()
        self._starts = StartRecorder(runtime)  # of the attempts claimed held (waiting at the gate)
        self._payloads = PayloadMemory(s.payload_memory)  # payloads the claims did not carry
        self._background_tasks: set[asyncio.Task[None]] = set()  # claims (intakes) and attempts
        # Claims of consecutive reads overlap: while one batch's claim transaction runs, the next batch is
        # read and claimed (the database answers both; one claim at a time waits a round trip per read).
        self._intakes = anyio.Semaphore(_INTAKES_IN_FLIGHT)
        # A read takes at most a share of the slots, so batches stay in flight side by side even when
        # every slot is free: while one waits for its claim or its group commit, another's handlers
        # run (one batch of all the slots goes read, claim, run, commit in lockstep, the loop idle
        # through each transaction).
        self._read_max = max(1, self.concurrency // _INTAKES_IN_FLIGHT)
        self._intake_error: Exception | None = None  # a bug in an intake; run() raises it

    def stop(self) -> None:
        """Stop reading; in-flight tasks get ``shutdown_grace`` to finish (the rest stay pending)."""
        self._stopping.set()

    async def run(self, *, max_tasks: int | None = None, timeout: timedelta | None = None) -> int:
        """Work until ``max_tasks`` deliveries are settled, ``timeout`` passes, or :meth:`stop`;
        returns how many deliveries this call settled."""
        start = self.counters.settled
        with anyio.move_on_after(timeout.total_seconds() if timeout else math.inf):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._committer.run)
                tg.start_soon(self._acker.run)
                tg.start_soon(self._leases.run)
                tg.start_soon(self._starts.run)
                try:
                    await self._read_loop(start, max_tasks)
                    with anyio.move_on_after(self.runtime.settings.shutdown_grace.total_seconds()):
                        while self._in_flight:
                            await self._wait_for_a_slot()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._cancel_background_tasks()
                tg.cancel_scope.cancel()
        return self.counters.settled - start

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        # A plain asyncio task: anyio's start_soon costs several times more per task, a large share
        # of the worker's CPU at thousands of tasks/s. run() cancels the ones still running when it
        # returns. Each takes itself out of the set as it ends (_forget): a done callback would be
        # one more object for the task to hold and one more event-loop callback per task.
        task = asyncio.get_running_loop().create_task(work)
        self._background_tasks.add(task)
        return task

    def _forget(self) -> None:
        """The last step of a background task: its own end (see _background)."""
        self._background_tasks.discard(asyncio.current_task())

    async def _cancel_background_tasks(self) -> None:
        """Cancel the claims and attempts still running (their entries stay pending) and wait
        for them (a claim that finishes meanwhile starts nothing new)."""
        while self._background_tasks:
            running = list(self._background_tasks)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            self._background_tasks.difference_update(running)  # one cancelled before it started

    async def _read_loop(self, start: int, max_tasks: int | None) -> None:
        transport = self.runtime.transport()
        while not self._stopping.is_set():
            await self._intakes.acquire()  # released by the intake this iteration starts, if any
            if self._intake_error is not None:
                raise self._intake_error
            handed_off = False
            try:
                settled = self.counters.settled - start
                if max_tasks is not None and settled >= max_tasks:
                    return
                want = min(self.concurrency - self._in_flight, self._read_max)
                if self._gate.isolating:
                    # Suspects run apart: read only as many as could join their running group
                    # (reclaimed entries come back together); none while one waits its turn.
                    want = min(want, self._gate.room)
                if max_tasks is not None:
                    want = min(want, max_tasks - settled - self._in_flight)
                if want <= 0:
                    await self._wait_for_a_slot()
                    continue
                try:
                    entries = await transport.read(
                        self.queues, self.worker_id, count=want, block=self.runtime.settings.read_block
                    )
                except Exception:
                    logger.exception("reading streams failed; retrying in a second")
                    await anyio.sleep(1)
                    continue
                if entries:
                    self._in_flight += len(entries)
                    self._background(self._intake(entries))
                    handed_off = True
            finally:
                if not handed_off:
                    self._intakes.release()

    async def _wait_for_a_slot(self) -> None:
        self._slot_freed = anyio.Event()
        await self._slot_freed.wait()

    def _done(self, settled: bool) -> None:
        if settled:
            self.counters.settled += 1
        else:
            self.counters.unsettled += 1
        self._in_flight -= 1
        self._slot_freed.set()

    async def _intake(self, entries: Sequence[StreamEntry]) -> None:
        """Parse a read batch, claim it in one transaction, ack the stale, start the rest;
        then let the read loop start another intake."""
        try:
            await self._claim_and_start(entries)
        except Exception as exc:  # a bug, not an outage (those are handled inside): stop the worker
            self._intake_error = exc
            self._slot_freed.set()
        finally:
            self._intakes.release()
            self._forget()

    async def _claim_and_start(self, entries: Sequence[StreamEntry]) -> None:
        runtime = self.runtime
        transport = runtime.transport()
        batch: list[tuple[StreamEntry, Delivery, Span]] = []
        unknown: list[tuple[StreamEntry, Delivery]] = []  # tasks this worker does not register
        for entry in entries:
            try:
                delivery = transport.parse(entry.fields, entry.stream)
            except MalformedEntryError as exc:
                try:
                    await transport.dead_letter_malformed(
                        entry.queue, entry.stream, entry.entry_id, entry.fields, str(exc)
                    )
                except RedisError as redis_exc:  # stays pending: the reaper dead-letters it later
                    logger.warning("dead-lettering malformed entry %s failed: %s", entry.entry_id, redis_exc)
                    self._done(False)
                    continue
                self.counters.malformed += 1
                self._done(True)
                continue
            if delivery.name not in runtime.registry:
                unknown.append((entry, delivery))
                continue
            batch.append((entry, delivery, self._start_span(entry, delivery)))
        await hand_back(runtime, self.worker_id, unknown, self._done)
        batch = await runtime.flow.admit_entries(batch, self._end, self._ack_now)  # all, without limits
        if not batch:
            return
        requests = [ClaimRequest(d.task_id, d.generation, d.delivery, traceparent_of(span)) for _, d, span in batch]
        try:
            claims = await runtime.store.claim_executions(
                runtime.settings.namespace,
                requests,
                worker_id=self.worker_id,
                now=runtime.clock(),
                lease=runtime.settings.lease_timeout,
                hold=self._gate.isolating,  # its attempts wait at the gate: claimed held (StartRecorder)
            )
        except BaseException as exc:  # none starts (an outage, or the worker stops): free their slots
            runtime.flow.unclaimed(batch)
            if not isinstance(exc, SQLAlchemyError):
                raise
            logger.warning("cannot reach the database to claim %d entries (%s); they stay pending", len(batch), exc)
            for _, _, span in batch:
                self._end(span, "unreachable", settled=False)
            return
        runtime.flow.unclaimed(batch, claims)  # admitted, yet will not run: their slots go back
        stale: list[tuple[StreamEntry, Span]] = []
        suspects: list[tuple[StreamEntry, ExecutionClaim, Span]] = []  # after the others, which start now
        for (entry, delivery, span), claim in zip(batch, claims, strict=True):
            if claim is ClaimRefused.NO_TASK:
                # The database may be restoring or lagging: the reaper dead-letters the entry
                # only after visibility_timeout.
                logger.warning("a delivery names task %s, which does not exist; left pending", delivery.task_id)
                self._end(span, "no_task", settled=False)
            elif claim is ClaimRefused.STALE:
                stale.append((entry, span))
            elif claim.reclaims:
                suspects.append((entry, claim, span))
            else:
                self._start(entry, claim, span)
        for entry, claim, span in suspects:
            self._start(entry, claim, span)
        if stale:
            try:
                await self._ack_now([(e.stream, e.entry_id) for e, _ in stale])
                acked = True
            except RedisError as exc:  # they stay pending; the reaper acks stale entries later
                logger.warning("acknowledging %d stale entries failed: %s", len(stale), exc)
                acked = False
            for _, span in stale:
                self.counters.skipped_stale += 1
                self._end(span, "stale", settled=acked)

    def _start(self, entry: StreamEntry, claim: ExecutionClaim, span: Span) -> None:
        # Its slots go back when its task ends, even one cancelled before it ran (no finally then).
        self.runtime.flow.release_when_done(self._background(self._execute(entry, claim, span)), claim)

    def _start_span(self, entry: StreamEntry, d: Delivery) -> Span:
        tel = self.runtime.telemetry
        if not tel.tracing:
            return trace.INVALID_SPAN
        attributes = {
            "messaging.message.id": entry.entry_id,
            "messaging.consumer.group.name": CONSUMER_GROUP,
            "durable_tasks.task.id": d.task_id,
            "durable_tasks.generation": d.generation,
            "durable_tasks.delivery": d.delivery,
            "durable_tasks.delivery_count": d.delivery + 1,
            "durable_tasks.shadow": entry.shadow,
        }
        return tel.start_process_span(d.name, entry.queue, d.traceparent, attributes)

    def _end(self, span: Span, outcome: str, *, settled: bool) -> None:
        span.set_attribute("durable_tasks.outcome", outcome)
        span.end()
        self._done(settled)

    async def _execute(self, entry: StreamEntry, claim: ExecutionClaim, span: Span) -> None:
        runtime = self.runtime
        settled = False
        outcome = "unreachable"
        commit = PendingCommit(self._committer, entry)  # the committer acknowledges what it settles
        payload_bytes = 0
        try:
            with runtime.telemetry.current(span):
                if failpoints.ENABLED:
                    failpoints.hit("worker.after_claim")
                span.set_attribute("durable_tasks.attempt", claim.attempt)
                for link in link_to(claim.previous_traceparent, **{"durable_tasks.link": "previous_attempt"}):
                    span.add_link(link.context, link.attributes)
                runtime.telemetry.queue_delay.record(
                    (runtime.clock() - claim.created_at).total_seconds(), {"queue": claim.queue}
                )
                if claim.payload_json is None:  # over the claim's bound (tested here: no coroutine per attempt)
                    payload_bytes = await self._payloads.room_for(claim, self._leases)
                if claim.reclaims > 0:
                    outcome = await self._run_suspect(claim, span, commit)
                else:  # beside the others (in this frame: one coroutine fewer per attempt in flight)
                    await self._gate.join(self._leases.hold, claim)
                    try:
                        if claim.held:  # claimed while the worker isolated
                            await self._starts.started(claim)
                        outcome = await run_attempt(runtime, claim, span, commit, self._leases, self._handler_threads)
                    finally:
                        self._gate.leave()
                self.counters.count(outcome)
                runtime.telemetry.executions.add(
                    1, {"queue": claim.queue, "task": claim.name, "outcome": outcome.value}
                )
                if not commit.acked:  # recorded outside the committer (a failure): acknowledge it now
                    if failpoints.ENABLED:
                        failpoints.hit("worker.after_commit")
                    await self._acker.submit((entry.stream, entry.entry_id))
            settled = True
        except SQLAlchemyError as exc:
            logger.warning("cannot record the start or outcome of %s (%s); entry stays pending", claim.task_id, exc)
        except Exception:
            logger.exception("unexpected error running %s; its entry stays pending", claim.task_id)
        finally:
            self._payloads.release(payload_bytes)  # 0: nothing to give back
            self._leases.release(claim)  # held from a wait at the gate on; a no-op once run_attempt released it
            self._end(span, outcome, settled=settled)
            self._forget()

    async def _run_suspect(self, claim: ExecutionClaim, span: Span, commit: PendingCommit) -> ExecutionOutcome:
        """Run a suspect attempt in a group of suspects (see IsolationGate,
        policy.suspect_group_limit); one that runs alone is marked solo, so its loss counts.
        Its lease is renewed from its wait at the gate on (any attempt's wait there, too)."""
        runtime = self.runtime
        limit = suspect_group_limit(claim.reclaims, self.concurrency)
        async with self._gate.suspect(limit=limit, hold=partial(self._leases.hold, claim)) as alone:
            if alone:  # its start and its solitude, in one write
                await runtime.store.mark_solo(claim, now=runtime.clock())
            else:  # a suspect's claim is always held
                await self._starts.started(claim)
            return await run_attempt(runtime, claim, span, commit, self._leases, self._handler_threads)

    async def _commit(self, items: Sequence[PendingCommit]) -> None:
        """Commit a group of results, then acknowledge the entries whose outcome is recorded
        (committed or fenced out); a failed XACK leaves them pending for the reaper."""
        runtime, s = self.runtime, self.runtime.settings
        writes = [item.final_write for item in items]
        await runtime.store.commit_results(writes, now=runtime.clock())
        if failpoints.ENABLED:
            failpoints.hit("worker.after_commit")
        settled = [item for item, write in zip(items, writes, strict=True) if write.outcome in _ACKED_OUTCOMES]
        committed = [
            TaskOutcome(w.claim.task_id, w.claim.generation, TaskState.SUCCEEDED, w.result_json)
            for w in writes
            if w.outcome is CommitOutcome.COMMITTED and not w.claim.shadow
        ]
        by_stream = _by_stream((item.entry.stream, item.entry.entry_id) for item in settled)
        # The announcement wakes result waits; it never fails the commit (waits fall back).
        channel, message = announcement(s.namespace, committed, inline_bytes=s.result_inline_bytes)
        if resumed := runtime.new_deliveries([w.resumed for w in writes if w.resumed is not None]):
            await runtime.publish_committed(resumed)  # the parents these results resumed go out first
        try:
            await runtime.transport().ack_and_announce(by_stream, channel, message)
        except RedisError as exc:
            logger.warning("acknowledging %d committed entries failed (%s); the reaper will", len(settled), exc)
            return
        for item in settled:
            item.acked = True

    async def _ack_now(self, items: Sequence[tuple[str, str]]) -> None:
        transport = self.runtime.transport()
        for stream, ids in _by_stream(items).items():
            await transport.ack(stream, ids)


def _by_stream(items: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Entry ids per stream, from (stream, entry id) pairs."""
    by_stream: dict[str, list[str]] = defaultdict(list)
    for stream, entry_id in items:
        by_stream[stream].append(entry_id)
    return by_stream
