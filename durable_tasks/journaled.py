"""An attempt's journal on the store: the :class:`~.journal.JournalBackend` the worker gives
every async handler (``ctx.journal``), bound to the attempt's fencing token."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import anyio

from . import failpoints
from .codec import encode_payload
from .errors import JournalFencedOutError, UnknownTaskError
from .handler_threads import HandlerThreads
from .journal import Journal, PendingChild, PendingSignal, PreparedChild, RecordedStep, Suspended
from .runtime import Runtime
from .store.execution import ExecutionClaim
from .store.journal import child_task
from .tasks import Task, TaskContext

__all__ = ["StoreJournal", "run_handler"]


class StoreJournal:
    """Journal reads and fenced writes of one attempt."""

    __slots__ = ("claim", "runtime")

    def __init__(self, runtime: Runtime, claim: ExecutionClaim) -> None:
        self.runtime = runtime
        self.claim = claim

    async def load(self) -> Sequence[RecordedStep]:
        """Every row of the task's current generation."""
        return await self.runtime.store.load_steps(self.claim.task_id, self.claim.generation)

    async def record_step(self, slot: str, label: str, result_json: str) -> str:
        """Record a step (extending the lease); raises once the attempt is fenced out."""
        runtime = self.runtime
        stored = await runtime.store.record_step(
            self.claim, slot, label, result_json, now=runtime.clock(), lease=runtime.settings.lease_timeout
        )
        if stored is None:
            raise JournalFencedOutError(f"task {self.claim.task_id} moved on: step {slot} of this attempt is dropped")
        if failpoints.ENABLED:
            failpoints.hit("journal.after_step")
        return stored

    def prepare_child(self, task: Any, payload: Any) -> PreparedChild:
        """The child's registered task and its validated payload."""
        name = task if isinstance(task, str) else task.name
        found = self.runtime.registry.get(name)
        if found is None:
            raise UnknownTaskError(
                f"no task named {name!r} is registered here; register it before starting it as a child"
            )
        s = self.runtime.settings
        payload_json = encode_payload(
            found.payload_adapter, payload, task=name, max_bytes=s.max_payload_bytes, max_depth=s.max_json_depth
        )
        return PreparedChild(name, payload_json)

    async def suspend(self, children: Sequence[PendingChild], signals: Sequence[PendingSignal]) -> Suspended:
        """Submit the children, open the waits and leave the worker slot."""
        registry = self.runtime.registry
        rows = [
            (
                child,
                child_task(
                    self.claim,
                    child,
                    queue=registry[child.prepared.task_name].queue,
                    max_attempts=registry[child.prepared.task_name].max_attempts,
                ),
            )
            for child in children
        ]
        done = await self.runtime.store.suspend(self.claim, rows, signals, now=self.runtime.clock())
        if done is None:
            raise JournalFencedOutError(f"task {self.claim.task_id} moved on: its suspension is dropped")
        if failpoints.ENABLED:
            failpoints.hit("journal.after_suspend")
        return done


async def run_handler(
    runtime: Runtime,
    claim: ExecutionClaim,
    task: Task[Any, Any],
    ctx: TaskContext[Any],
    limiter: anyio.CapacityLimiter | HandlerThreads | None,
) -> tuple[Any, Suspended | None]:
    """Run the handler; an async one with its journal, which may suspend it. ``task.timeout``
    bounds the attempt (a suspension ends it early)."""
    if task.timeout is None:
        return await _journaled(runtime, claim, task, ctx, limiter)
    try:
        with anyio.fail_after(task.timeout.total_seconds()):
            return await _journaled(runtime, claim, task, ctx, limiter)
    except TimeoutError:
        ctx.cancelled.set()  # an abandoned sync handler learns it should stop
        raise


async def _journaled(
    runtime: Runtime,
    claim: ExecutionClaim,
    task: Task[Any, Any],
    ctx: TaskContext[Any],
    limiter: anyio.CapacityLimiter | HandlerThreads | None,
) -> tuple[Any, Suspended | None]:
    if not task.is_async:
        return await task.run(ctx, limiter=limiter), None
    ctx.journal = Journal(StoreJournal(runtime, claim), claim.task_id, claim.generation, claim.attempt == 1)
    return await ctx.journal.run(partial(task.run, ctx, limiter=limiter))
