"""One execution attempt, from a claimed delivery to its recorded outcome.

The handler runs with a heartbeat extending its lease; a result goes to the group committer
(a fenced write); a failure is recorded fenced, with a retry through a new outbox row or a
final FAILED. Decisions come from :mod:`.policy`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import StrEnum
from typing import Any

import anyio
from opentelemetry.trace import Span
from sqlalchemy.exc import SQLAlchemyError

from . import failpoints
from .codec import decode_payload, encode_result
from .errors import ChildTaskFailedError, JournalFencedOutError, PayloadValidationError, ResultNotSerializableError
from .failures import Failure
from .handler_threads import HandlerThreads
from .journaled import StoreJournal, run_handler
from .outcome import TaskOutcome
from .policy import FailureDecision, backoff_delay, decide_after_failure
from .records import TaskState
from .runtime import Runtime
from .store.execution import ExecutionClaim
from .store.results import CommitOutcome, FinalWrite
from .tasks import Task, TaskContext, session_hooks
from .transport.announce import announce_outcomes

__all__ = ["ExecutionOutcome", "LeaseKeeper", "run_attempt"]

logger = logging.getLogger(__name__)

# A child's recorded failure replays the same on every attempt: retrying cannot change it.
_NOT_RETRYABLE = (PayloadValidationError, ResultNotSerializableError, ChildTaskFailedError)


class ExecutionOutcome(StrEnum):
    """What one attempt came to, as the worker counts it (the ``outcome`` of the executions
    metric). The audit trail records RETRYING and FAILED both as ``failed`` (with a retry
    reason for the first)."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    FAILED = "failed"
    FENCED_OUT = "fenced_out"
    SUSPENDED = "suspended"  # waits for children or a signal, without a worker slot


#: ``commit(write)``: hands a final write to the group committer and waits for its outcome.
Commit = Callable[[FinalWrite], Awaitable[None]]


async def run_attempt(
    runtime: Runtime,
    claim: ExecutionClaim,
    span: Span,
    commit: Commit,
    leases: LeaseKeeper,
    handler_threads: anyio.CapacityLimiter | HandlerThreads | None = None,
) -> ExecutionOutcome:
    """Run a claimed attempt and record its outcome; returns it. Raises SQLAlchemyError when
    the outcome cannot be recorded."""
    tel = runtime.telemetry
    link = StoreJournal(runtime, claim)
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
        _link=link,
    )
    task = runtime.registry.get(claim.name)
    if task is None:
        return await _fail(runtime, claim, None, ctx, LookupError(f"no task {claim.name!r} is registered here"), span)
    try:
        if claim.payload_json is not None:  # carried by the claim (no coroutine per attempt)
            ctx.payload = decode_payload(task.payload_adapter, claim.payload_json, task=claim.name)
        else:
            ctx.payload = await _large_payload(runtime, claim, task)
    except PayloadValidationError as exc:
        return await _fail(runtime, claim, task, ctx, exc, span)
    started = time.perf_counter()
    leases.hold(claim, ctx)
    try:
        result, suspended = await run_handler(link, task, ctx, handler_threads)
        if suspended is not None:
            logger.debug("task %s attempt %s suspended (%s)", claim.task_id, claim.attempt, suspended)
            return ExecutionOutcome.SUSPENDED
        result_json = encode_result(
            task.result_adapter,
            result,
            task=claim.name,
            max_bytes=runtime.settings.max_payload_bytes,
            max_depth=runtime.settings.max_json_depth,
        )
    except JournalFencedOutError:
        runtime.telemetry.fenced_out.add(1, {"queue": claim.queue, "task": claim.name})
        return ExecutionOutcome.FENCED_OUT
    except Exception as exc:
        return await _fail(runtime, claim, task, ctx, exc, span)
    finally:
        leases.release(claim)
        tel.execution_time.record(time.perf_counter() - started, {"queue": claim.queue, "task": claim.name})
    if failpoints.ENABLED:
        failpoints.hit("worker.after_run")
    if tel.tracing:
        span.set_attributes(tel.payload_attributes(claim.name, "result", result_json))
    write = FinalWrite(claim, result_json, hook=session_hooks(task.hooks, ctx, result))
    with tel.commit_span() as commit_span:
        await commit(write)
        commit_span.set_attribute("durable_tasks.fenced_out", write.outcome is CommitOutcome.FENCED_OUT)
    if write.outcome is CommitOutcome.FENCED_OUT:
        tel.fenced_out.add(1, {"queue": claim.queue, "task": claim.name})
        logger.info("result of %s gen %s attempt %s fenced out", claim.task_id, claim.generation, claim.attempt)
        return ExecutionOutcome.FENCED_OUT
    if write.outcome is CommitOutcome.HOOK_FAILED:
        assert write.hook_error is not None
        return await _fail(runtime, claim, task, ctx, write.hook_error, span, in_hook=True)
    tel.end_to_end.record((runtime.clock() - claim.created_at).total_seconds(), {"queue": claim.queue})
    return ExecutionOutcome.SUCCEEDED


class LeaseKeeper:
    """Extends the leases of every attempt this worker runs, in one statement per heartbeat;
    an attempt found fenced out is told so (``ctx.fenced_out``, ``ctx.cancelled``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._held: dict[str, tuple[ExecutionClaim, TaskContext[Any] | None]] = {}

    def hold(self, claim: ExecutionClaim, ctx: TaskContext[Any] | None = None) -> None:
        """Keep ``claim``'s lease alive until :meth:`release` (``ctx``, when running, is told
        if the attempt is found fenced out)."""
        self._held[claim.task_id] = (claim, ctx)

    def release(self, claim: ExecutionClaim) -> None:
        """Stop extending ``claim``'s lease."""
        held = self._held.get(claim.task_id)
        if held is not None and held[0] is claim:
            del self._held[claim.task_id]

    async def run(self) -> None:
        """Renew every ``heartbeat_interval`` until cancelled."""
        while True:
            await anyio.sleep(self.runtime.settings.heartbeat_interval.total_seconds())
            await self._renew()

    async def _renew(self) -> None:
        # Its own frame: the loop's, which sleeps between heartbeats, holds no attempt (a
        # finished one's context and payload would stay alive until the next heartbeat).
        runtime = self.runtime
        held = list(self._held.values())
        if not held:
            return
        try:
            alive = await runtime.store.renew_leases(
                [claim for claim, _ in held], now=runtime.clock(), lease=runtime.settings.lease_timeout
            )
        except SQLAlchemyError as exc:
            logger.warning("renewing %d leases failed: %s", len(held), exc)
            return  # unknown: keep running; the fence decides at commit
        for claim, ctx in held:
            if claim.task_id not in alive and ctx is not None:
                ctx.fenced_out = True
                ctx.cancelled.set()


async def _large_payload(runtime: Runtime, claim: ExecutionClaim, task: Task[Any, Any]) -> Any:
    """A payload larger than a claim carries, read alone (the worker has made room for it) and
    decoded. Its JSON text lives in this frame only, not in the attempt's while the handler
    runs: a worker's ``payload_memory`` counts a large payload once, and the text would hold as
    much again (measured at 1 MB: docs/performance.md)."""
    payload_json = await runtime.store.read_payload(claim.task_id)
    if payload_json is None:
        raise LookupError(f"task {claim.task_id} was deleted while it ran")
    return decode_payload(task.payload_adapter, payload_json, task=claim.name)


async def _fail(
    runtime: Runtime,
    claim: ExecutionClaim,
    task: Task[Any, Any] | None,
    ctx: TaskContext[Any],
    exc: BaseException,
    span: Span,
    *,
    in_hook: bool = False,
) -> ExecutionOutcome:
    s = runtime.settings
    failure = Failure.of(exc, in_hook=in_hook)
    runtime.telemetry.record_failure(span, exc, failure.message)
    retryable = not isinstance(exc, _NOT_RETRYABLE) and (
        task is None or not task.retry_on or isinstance(exc, task.retry_on)
    )
    # Failures, not claims, spend the retry budget: an attempt lost with its worker does not.
    failures = claim.failures + 1
    decision = decide_after_failure(attempt=failures, max_attempts=claim.max_attempts, retryable=retryable)
    now = runtime.clock()
    retry_at = None
    if decision is FailureDecision.RETRY:
        retry_at = now + backoff_delay(
            failures, initial=s.retry_backoff_initial, cap=s.retry_backoff_max, jitter=s.backoff_jitter
        )
    recorded = await runtime.store.record_failure(
        claim,
        now=now,
        error_type=failure.error_type,
        error_message=failure.recorded_message,
        retry_at=retry_at,
        on_failed=session_hooks(task.failure_hooks, ctx, exc) if task else None,
        traceback=failure.traceback,
        in_hook=in_hook,
    )
    _log_failure(claim, failure, retry_at if recorded is not None else None, recorded=recorded is not None)
    if recorded is None:
        runtime.telemetry.fenced_out.add(1, {"queue": claim.queue, "task": claim.name})
        return ExecutionOutcome.FENCED_OUT
    if retry_at is not None:
        return ExecutionOutcome.RETRYING
    if recorded.resumed is not None:  # the parent this final failure resumed goes out now
        await runtime.publish_committed(runtime.new_deliveries([recorded.resumed]))
    if not claim.shadow:  # wake the result waits on it
        failed = TaskOutcome(
            claim.task_id, claim.generation, TaskState.FAILED, None, failure.error_type, failure.recorded_message
        )
        await announce_outcomes(runtime.transport().client, s.namespace, [failed], inline_bytes=s.result_inline_bytes)
    return ExecutionOutcome.FAILED


def _log_failure(claim: ExecutionClaim, failure: Failure, retry_at: datetime | None, *, recorded: bool) -> None:
    """One record per failed attempt: what failed (the body or its on_commit hook), where, what
    comes next, and the traceback (scrubbed and bounded as stored)."""
    if not recorded:
        then, level = "a newer execution owns the task: nothing recorded", logging.INFO
    elif retry_at is not None:
        then, level = f"retrying at {retry_at:%Y-%m-%dT%H:%M:%S}Z", logging.WARNING
    else:
        then, level = "FAILED, no attempts left", logging.ERROR
    what = "task"
    if failure.in_hook:
        what, then = "the on_commit hook of task", f"its result and the hook's writes rolled back; {then}"
    logger.log(
        level,
        "%s %s (id %s, queue %s) attempt %s raised %s: %s; %s\n%s",
        what,
        claim.name,
        claim.task_id,
        claim.queue,
        claim.attempt,
        failure.error_type,
        failure.message,
        then,
        failure.traceback.rstrip(),
    )
