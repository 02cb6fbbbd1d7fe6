"""An attempt's link to its worker: its lease (``ctx.heartbeat()``) and its journal on the store,
the :class:`~.journal.JournalBackend` of an async handler's ``ctx.journal``, bound to the
attempt's fencing token; and how the worker runs a handler with them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import Any

import anyio
from sqlalchemy.exc import SQLAlchemyError

from . import failpoints
from .codec import encode_payload, utf8_length
from .errors import JournalFencedOutError, ResultNotSerializableError, UnknownTaskError
from .flow.policy import dispatch_due, submit_flow
from .handler_threads import HandlerThreads
from .journal import (
    Journal,
    PendingChild,
    PendingSignal,
    PreparedChild,
    RecordedStep,
    Suspended,
    end_journal_source,
    journal_source,
)
from .runtime import Runtime
from .store.execution import ExecutionClaim
from .store.journal import child_task
from .store.submit import NewTask
from .tasks import Task, TaskContext

__all__ = ["StoreJournal", "run_handler"]

logger = logging.getLogger(__name__)


class StoreJournal:
    """One attempt's link to its worker (the :class:`~.tasks.AttemptLink` of its context):
    heartbeats, and the journal's reads and fenced writes. The journal itself is made on
    first use: an attempt whose handler never touches it builds none."""

    __slots__ = ("_journal", "claim", "host", "runtime")

    def __init__(self, runtime: Runtime, claim: ExecutionClaim) -> None:
        self.runtime = runtime
        self.claim = claim
        #: The asyncio task running an async handler (None for a sync one, which has no journal).
        self.host: asyncio.Task[Any] | None = None
        self._journal: Journal | None = None

    def journal(self) -> Journal | None:
        """The attempt's journal, made on the first call (None for a sync handler)."""
        if self._journal is None and self.host is not None:
            claim = self.claim
            self._journal = Journal(self, claim.task_id, claim.generation, claim.attempt == 1, _host=self.host)
        return self._journal

    async def heartbeat(self) -> bool:
        """Extend the lease now; False once the attempt is fenced out."""
        runtime = self.runtime
        try:
            return await runtime.store.heartbeat(self.claim, now=runtime.clock(), lease=runtime.settings.lease_timeout)
        except SQLAlchemyError as exc:
            logger.warning("heartbeat of %s failed: %s", self.claim.task_id, exc)
            return True  # unknown: keep running; the fence decides at commit

    async def load(self) -> Sequence[RecordedStep]:
        """Every row of the task's current generation."""
        return await self.runtime.store.load_steps(self.claim.task_id, self.claim.generation)

    async def record_step(self, slot: str, label: str, result_json: str) -> str:
        """Record a step (extending the lease); raises once the attempt is fenced out."""
        runtime = self.runtime
        limit = runtime.settings.max_payload_bytes
        if (size := utf8_length(result_json)) > limit:
            raise ResultNotSerializableError(
                f"step {label!r} of task {self.claim.name!r} returned {size} bytes of JSON, over "
                f"max_payload_bytes={limit}; store large data elsewhere and record its key"
            )
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
        now = self.runtime.clock()
        rows = [(child, self._child_task(child, now)) for child in children]
        done = await self.runtime.store.suspend(self.claim, rows, signals, now=now)
        if done is None:
            raise JournalFencedOutError(f"task {self.claim.task_id} moved on: its suspension is dropped")
        if failpoints.ENABLED:
            failpoints.hit("journal.after_suspend")
        if done.created:  # committed: their entries go out now, as a submit's do at its commit
            tasks, outcomes = zip(*done.created, strict=True)
            await self.runtime.publish_committed(self.runtime.first_deliveries(tasks, outcomes, now))
        return done.state

    def _child_task(self, child: PendingChild, now: datetime) -> NewTask:
        """The child's row as a submit of its task writes it: its queue, attempts and declared
        priority (a level's head start in the dispatcher's due order included)."""
        task = self.runtime.registry[child.prepared.task_name]
        prioritized = self.runtime.prioritized(task.queue)
        priority, _ = submit_flow(task.flow, task.queue, prioritized=prioritized, priority=None, concurrency_key=None)
        return child_task(
            self.claim,
            child,
            queue=task.queue,
            max_attempts=task.max_attempts,
            priority=priority,
            due=dispatch_due(now, None, priority),
        )


def run_handler(
    link: StoreJournal,
    task: Task[Any, Any],
    ctx: TaskContext[Any],
    limiter: anyio.CapacityLimiter | HandlerThreads | None,
) -> Awaitable[tuple[Any, Suspended | None]]:
    """Run the handler (``ctx``'s link is ``link``); an async one with its journal, which may
    suspend it. ``task.timeout`` bounds the attempt (a suspension ends it early). Not a
    coroutine itself: an attempt in flight keeps one frame fewer alive."""
    if task.timeout is None:
        return _run(link, task, ctx, limiter)
    return _run_within(task.timeout.total_seconds(), link, task, ctx, limiter)


async def _run_within(
    seconds: float,
    link: StoreJournal,
    task: Task[Any, Any],
    ctx: TaskContext[Any],
    limiter: anyio.CapacityLimiter | HandlerThreads | None,
) -> tuple[Any, Suspended | None]:
    try:
        with anyio.fail_after(seconds):
            return await _run(link, task, ctx, limiter)
    except TimeoutError:
        ctx.cancelled.set()  # an abandoned sync handler learns it should stop
        raise


async def _run(
    link: StoreJournal,
    task: Task[Any, Any],
    ctx: TaskContext[Any],
    limiter: anyio.CapacityLimiter | HandlerThreads | None,
) -> tuple[Any, Suspended | None]:
    """Journal.run's steps, for a journal made only if the handler uses it."""
    if not task.is_async:
        return await task.run(ctx, limiter=limiter), None
    link.host = asyncio.current_task()
    token = journal_source(link)  # current_journal() makes the journal when first asked, as ctx.journal does
    try:
        try:
            result = await task.run(ctx)
        except asyncio.CancelledError:
            if link._journal is None or not link._journal.took_back_cancellation():
                raise  # cancelled from outside (a timeout, a stopping worker), not suspended
            result = None
        else:
            if link._journal is not None:
                link._journal.took_back_cancellation()  # the handler may have swallowed the watcher's
        finally:
            if link._journal is not None:
                link._journal.stop_watching()
        if link._journal is None:
            return result, None  # no journal, so no wait: nothing can have suspended the handler
        return await link._journal.outcome(result)
    finally:
        end_journal_source(token)
