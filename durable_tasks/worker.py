"""Consumer loop: read entries, take the execution fence, run, heartbeat, commit fenced, ack.

An entry is acknowledged only after the database has recorded what happened to it (result,
failure, or "stale"): a worker that cannot reach the database leaves the entry in the PEL
for the reaper.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import sqlalchemy as sa
from anyio import to_thread
from anyio.abc import TaskGroup
from opentelemetry.trace import Span
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from . import failpoints
from .codec import decode_payload, encode_result
from .commit import GroupCommitter
from .errors import PayloadValidationError, ResultNotSerializableError
from .policy import FailureDecision, backoff_delay, decide_after_failure
from .store import execution
from .store.execution import ClaimRefused, CommitOutcome, ExecutionClaim, FinalWrite
from .tasks import Task, TaskContext
from .telemetry import link_to, traceparent_of
from .transport.keys import CONSUMER_GROUP
from .transport.messages import Delivery, MalformedEntryError, StreamEntry, parse_delivery

if TYPE_CHECKING:
    from .app import App

__all__ = ["Worker", "WorkerCounters"]

logger = logging.getLogger(__name__)

_NOT_RETRYABLE = (PayloadValidationError, ResultNotSerializableError)


class WorkerCounters:
    """What one worker did; tests and stats read it."""

    def __init__(self) -> None:
        self.settled = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.skipped_stale = 0
        self.fenced_out = 0
        self.malformed = 0
        self.unsettled = 0


class Worker:
    """Runs the tasks of some queues of one App, ``concurrency`` at a time."""

    def __init__(self, app: App, *, queues: list[str] | None = None, concurrency: int | None = None) -> None:
        self.app = app
        self.queues = queues or sorted({t.queue for t in app.registry.values()})
        self.concurrency = concurrency or app.settings.concurrency
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.counters = WorkerCounters()
        self._in_flight = 0
        self._stopping = anyio.Event()
        self._slot_freed = anyio.Event()
        self._committer = GroupCommitter(
            app.engine, app.clock, max_batch=app.settings.commit_batch_max, window=app.settings.commit_window
        )

    def stop(self) -> None:
        """Stop reading; in-flight tasks get ``shutdown_grace`` to finish (the rest stay pending)."""
        self._stopping.set()

    async def run(self, *, max_tasks: int | None = None, timeout: timedelta | None = None) -> int:
        """Work until ``max_tasks`` deliveries are settled, ``timeout`` passes, or :meth:`stop`.

        Returns how many deliveries this call settled.
        """
        start = self.counters.settled
        with anyio.move_on_after(timeout.total_seconds() if timeout else math.inf):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._committer.run)
                await self._read_loop(tg, start, max_tasks)
                with anyio.move_on_after(self.app.settings.shutdown_grace.total_seconds()):
                    while self._in_flight:
                        await self._wait_for_a_slot()
                tg.cancel_scope.cancel()
        return self.counters.settled - start

    async def _read_loop(self, tg: TaskGroup, start: int, max_tasks: int | None) -> None:
        streams = [(q, shadow) for q in self.queues for shadow in (False, True)]
        transport = self.app.transport()
        while not self._stopping.is_set():
            settled = self.counters.settled - start
            if max_tasks is not None and settled >= max_tasks:
                return
            want = self.concurrency - self._in_flight
            if max_tasks is not None:
                want = min(want, max_tasks - settled - self._in_flight)
            if want <= 0:
                await self._wait_for_a_slot()
                continue
            try:
                entries = await transport.read(streams, self.worker_id, count=want, block=self.app.settings.read_block)
            except Exception:
                logger.exception("reading streams failed; retrying in a second")
                await anyio.sleep(1)
                continue
            for entry in entries:
                self._in_flight += 1
                tg.start_soon(self._handle_and_count, entry)

    async def _wait_for_a_slot(self) -> None:
        self._slot_freed = anyio.Event()
        await self._slot_freed.wait()

    async def _handle_and_count(self, entry: StreamEntry) -> None:
        settled = False
        try:
            settled = await self.handle(entry)
        except Exception:
            logger.exception("unexpected error handling entry %s; it stays pending", entry.entry_id)
        finally:
            if settled:
                self.counters.settled += 1
            else:
                self.counters.unsettled += 1
            self._in_flight -= 1
            self._slot_freed.set()

    async def handle(self, entry: StreamEntry) -> bool:
        """Process one entry; True when the database recorded its outcome and it was acked."""
        transport = self.app.transport()
        stream = transport.keys(entry.queue).stream_for(shadow=entry.shadow)
        try:
            delivery = parse_delivery(entry.fields)
        except MalformedEntryError as exc:
            await transport.dead_letter_malformed(entry.queue, stream, entry.entry_id, entry.fields, str(exc))
            self.counters.malformed += 1
            return True
        attributes = {
            "messaging.message.id": entry.entry_id,
            "messaging.consumer.group.name": CONSUMER_GROUP,
            "durable_tasks.task.id": delivery.task_id,
            "durable_tasks.generation": delivery.generation,
            "durable_tasks.delivery": delivery.delivery,
            "durable_tasks.delivery_count": delivery.delivery + 1,
            "durable_tasks.shadow": entry.shadow,
        }
        with self.app.telemetry.process_span(delivery.name, entry.queue, delivery.traceparent, attributes) as span:
            outcome = await self._process(delivery, span)
            span.set_attribute("durable_tasks.outcome", outcome)
        if outcome in ("unreachable", "no_task"):
            return False
        if failpoints.ENABLED:
            failpoints.hit("worker.after_commit")
        await transport.ack(stream, [entry.entry_id])
        return True

    async def _process(self, d: Delivery, span: Span) -> str:
        """Claim, run and record one delivery; returns the outcome named on the span."""
        try:
            claim = await self._claim(d, traceparent_of(span))
        except SQLAlchemyError as exc:
            logger.warning("cannot reach the database to claim %s (%s); entry stays pending", d.task_id, exc)
            return "unreachable"
        if claim is ClaimRefused.NO_TASK:
            # The database may be restoring or lagging: the reaper dead-letters the entry only
            # after visibility_timeout.
            logger.warning("a delivery names task %s, which does not exist; left pending", d.task_id)
            return "no_task"
        if claim is ClaimRefused.STALE:
            self.counters.skipped_stale += 1
            return "stale"
        if failpoints.ENABLED:
            failpoints.hit("worker.after_claim")
        span.set_attribute("durable_tasks.attempt", claim.attempt)
        for link in link_to(claim.previous_traceparent, **{"durable_tasks.link": "previous_attempt"}):
            span.add_link(link.context, link.attributes)
        self.app.telemetry.queue_delay.record(
            (self.app.clock() - claim.created_at).total_seconds(), {"queue": claim.queue}
        )
        try:
            outcome = await self._execute(claim, span)
        except SQLAlchemyError as exc:
            logger.warning("cannot record the outcome of %s (%s); entry stays pending", claim.task_id, exc)
            return "unreachable"
        self.app.telemetry.executions.add(1, {"queue": claim.queue, "task": claim.name, "outcome": outcome})
        return outcome

    async def _claim(self, d: Delivery, traceparent: str | None) -> ExecutionClaim | ClaimRefused:
        app = self.app
        return await to_thread.run_sync(
            partial(
                execution.claim_execution,
                app.engine,
                app.settings.namespace,
                task_id=d.task_id,
                generation=d.generation,
                delivery=d.delivery,
                worker_id=self.worker_id,
                now=app.clock(),
                lease=app.settings.lease_timeout,
                traceparent=traceparent,
            )
        )

    async def _execute(self, claim: ExecutionClaim, span: Span) -> str:
        """Run the claimed attempt and record its outcome (raises SQLAlchemyError if it cannot)."""
        tel = self.app.telemetry
        ctx: TaskContext[Any] = TaskContext(
            task_id=claim.task_id,
            name=claim.name,
            queue=claim.queue,
            generation=claim.generation,
            attempt=claim.attempt,
            delivery=claim.delivery,
            idempotency_key=claim.idempotency_key,
            payload=None,  # set once decoded; failure hooks may see None
            shadow=claim.shadow,
            _beat=partial(self._beat, claim),
        )
        task = self.app.registry.get(claim.name)
        if task is None:
            return await self._fail(claim, None, ctx, LookupError(f"no task {claim.name!r} is registered here"), span)
        try:
            ctx.payload = decode_payload(task.payload_adapter, claim.payload_json, task=claim.name)
        except PayloadValidationError as exc:
            return await self._fail(claim, task, ctx, exc, span)
        started = time.perf_counter()
        try:
            result = await self._run_with_heartbeat(task, ctx)
            result_json = encode_result(
                task.result_adapter,
                result,
                task=claim.name,
                max_bytes=self.app.settings.max_payload_bytes,
                max_depth=self.app.settings.max_json_depth,
            )
        except Exception as exc:
            return await self._fail(claim, task, ctx, exc, span)
        finally:
            tel.execution_time.record(time.perf_counter() - started, {"queue": claim.queue, "task": claim.name})
        if failpoints.ENABLED:
            failpoints.hit("worker.after_run")
        span.set_attributes(tel.payload_attributes(claim.name, "result", result_json))
        write = FinalWrite(claim, result_json, hook=_session_hooks(task.hooks, ctx, result))
        with tel.commit_span() as commit_span:
            await self._committer.commit(write)
            commit_span.set_attribute("durable_tasks.fenced_out", write.outcome is CommitOutcome.FENCED_OUT)
        if write.outcome is CommitOutcome.FENCED_OUT:
            self.counters.fenced_out += 1
            tel.fenced_out.add(1, {"queue": claim.queue, "task": claim.name})
            logger.info("result of %s gen %s attempt %s fenced out", claim.task_id, claim.generation, claim.attempt)
            return "fenced_out"
        if write.outcome is CommitOutcome.HOOK_FAILED:
            assert write.hook_error is not None
            return await self._fail(claim, task, ctx, write.hook_error, span)
        self.counters.succeeded += 1
        tel.end_to_end.record((self.app.clock() - claim.created_at).total_seconds(), {"queue": claim.queue})
        return "succeeded"

    async def _run_with_heartbeat(self, task: Task[Any, Any], ctx: TaskContext[Any]) -> Any:
        interval = self.app.settings.heartbeat_interval.total_seconds()
        result: Any = None
        error: Exception | None = None

        async def beat() -> None:
            while True:
                await anyio.sleep(interval)
                await ctx.heartbeat()

        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            try:
                with anyio.fail_after(task.timeout.total_seconds() if task.timeout else math.inf):
                    result = await task.run(ctx)
            except Exception as exc:  # raised below, outside the group: no ExceptionGroup wrapping
                error = exc
                if isinstance(exc, TimeoutError):
                    ctx.cancelled.set()  # an abandoned sync handler learns it should stop
            finally:
                tg.cancel_scope.cancel()
        if error is not None:
            raise error
        return result

    async def _beat(self, claim: ExecutionClaim) -> bool:
        app = self.app
        now = app.clock()
        try:
            return await to_thread.run_sync(
                lambda: execution.heartbeat(app.engine, claim, now=now, lease=app.settings.lease_timeout)
            )
        except SQLAlchemyError as exc:
            logger.warning("heartbeat of %s failed: %s", claim.task_id, exc)
            return True  # unknown: keep running; the fence decides at commit

    async def _fail(
        self,
        claim: ExecutionClaim,
        task: Task[Any, Any] | None,
        ctx: TaskContext[Any],
        exc: BaseException,
        span: Span,
    ) -> str:
        app, s = self.app, self.app.settings
        app.telemetry.record_failure(span, exc)
        retryable = not isinstance(exc, _NOT_RETRYABLE) and (
            task is None or not task.retry_on or isinstance(exc, task.retry_on)
        )
        # Failures, not claims, spend the retry budget: an attempt lost with its worker does not.
        failures = claim.failures + 1
        decision = decide_after_failure(attempt=failures, max_attempts=claim.max_attempts, retryable=retryable)
        now = app.clock()
        retry_at = None
        if decision is FailureDecision.RETRY:
            retry_at = now + backoff_delay(
                failures, initial=s.retry_backoff_initial, cap=s.retry_backoff_max, jitter=s.backoff_jitter
            )
        recorded = await to_thread.run_sync(
            partial(
                execution.record_failure,
                app.engine,
                claim,
                now=now,
                error_type=type(exc).__qualname__,
                error_message=f"{exc}"[:4000],
                retry_at=retry_at,
                on_failed=_session_hooks(task.failure_hooks, ctx, exc) if task else None,
            )
        )
        logger.info(
            "task %s attempt %s failed with %s (%s)",
            claim.task_id,
            claim.attempt,
            type(exc).__qualname__,
            "retrying" if retry_at else "final",
        )
        if not recorded:
            self.counters.fenced_out += 1
            app.telemetry.fenced_out.add(1, {"queue": claim.queue, "task": claim.name})
            return "fenced_out"
        if retry_at is None:
            self.counters.failed += 1
            return "failed"
        self.counters.retried += 1
        return "retrying"


def _session_hooks(hooks: Sequence[Callable[..., None]], ctx: TaskContext[Any], value: Any) -> Any:
    """Run user hooks ``hook(session, ctx, value)`` on the fenced transaction's connection."""
    if not hooks:
        return None

    def run(conn: sa.Connection) -> None:
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            for hook in hooks:
                hook(session, ctx, value)
            session.commit()  # releases the session's savepoint; the fenced transaction commits later

    return run
