"""Writing intents, the App's side: submit (one, many, from an ``AsyncSession``), rerun and
cancel, each in the caller's transaction, and a handle on a task submitted elsewhere."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Unpack

from sqlalchemy.orm import Session

from . import codec
from .clock import due_time
from .errors import (
    IdempotencyConflictError,
    InvalidIdempotencyKeyError,
    PayloadError,
    TaskNotFoundError,
    UnknownTaskError,
)
from .flow.policy import check_partition_key, dispatch_due, submit_flow
from .outages import UNREACHABLE, database_error
from .store.ids import is_task_id_shaped
from .store.submit import NewTask, SubmitOutcome
from .submit_checks import check_same_payloads, check_session, undo_submits
from .tasks import SubmitOptions, Task, TaskHandle
from .telemetry import traceparent_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from .clock import Clock
    from .result_waits import ResultWaits
    from .runtime import Runtime
    from .settings import Settings

__all__ = ["IntentsMixin"]


class IntentsMixin:
    """submit, submit_many, asubmit, handle, rerun, cancel; mixed into :class:`~durable_tasks.App`."""

    runtime: Runtime
    settings: Settings
    clock: Clock
    results: ResultWaits
    _registry: dict[str, Task[Any, Any]]

    def _database_errors(self) -> AbstractContextManager[None]:  # pragma: no cover - the App's
        raise NotImplementedError

    def submit(
        self,
        session: Session,
        task: Task[Any, Any] | str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        shadow: bool = False,
        partition_key: str | None = None,
        delay: timedelta | None = None,
        not_before: datetime | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> TaskHandle:
        """Record a task intent in ``session``'s transaction; the caller commits.

        ``partition_key`` picks the stream partition of a partitioned queue (tasks with the same
        key stay in one partition, in order); by default the task id spreads them. ``delay`` or
        ``not_before`` (timezone-aware) make the task due later: nothing is published before.
        ``priority`` (0-3, on a queue with levels) overrides the task's; ``concurrency_key``
        names what the task's concurrency limit counts, e.g. ``"user:42"``
        (docs/flow-control.md).

        Raises a typed error, writing nothing, for an unknown task, an invalid, non-JSON or
        oversized payload, a bad idempotency key, a bad delay, an unreachable database, an
        Engine or Connection passed as ``session`` (InvalidSessionError), or an idempotency key
        this task already holds with a different payload (IdempotencyConflictError: the same
        key and payload return the existing task, ``created=False``).
        """
        (handle,) = self.submit_many(
            session,
            task,
            [(payload, idempotency_key)],
            shadow=shadow,
            partition_key=partition_key,
            delay=delay,
            not_before=not_before,
            priority=priority,
            concurrency_key=concurrency_key,
        )
        return handle

    def submit_many(
        self,
        session: Session,
        task: Task[Any, Any] | str,
        items: Iterable[tuple[Any, str | None]],
        *,
        shadow: bool = False,
        partition_key: str | None = None,
        delay: timedelta | None = None,
        not_before: datetime | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> list[TaskHandle]:
        """Record several intents of one task, ``(payload, idempotency_key)`` pairs, in
        ``session``'s transaction; the caller commits. Handles come back in order.

        Every payload and key is checked before anything is written (one bad item: a typed
        error, nothing written). On PostgreSQL the batch is one statement: one round trip. A
        duplicate key (in the database, in this transaction, or earlier in the batch) resolves
        as a single submit does: the existing task's handle, ``created=False``; with a different
        payload it raises IdempotencyConflictError instead (nothing of the batch written).
        """
        check_session(session, "submit")
        task = self._task(task)
        s, telemetry = self.settings, self.runtime.telemetry
        now = self.clock()
        due = due_time(now, delay=delay, not_before=not_before)
        priority, concurrency_key = submit_flow(
            task.flow,
            task.queue,
            prioritized=self.runtime.prioritized(task.queue),
            priority=priority,
            concurrency_key=concurrency_key,
        )
        due = dispatch_due(now, due, priority)  # a level goes ahead in the dispatcher's due order
        partition_key = check_partition_key(partition_key)
        checked = [self._checked_item(task, i, item) for i, item in enumerate(items)]
        with telemetry.submit_span(task.name, task.queue) as span:
            if len(checked) == 1:
                span.set_attributes(telemetry.payload_attributes(task.name, "payload", checked[0][0]))
            traceparent = traceparent_of(span)
            intents = [
                NewTask(
                    namespace=s.namespace,
                    name=task.name,
                    queue=task.queue,
                    payload_json=payload_json,
                    idempotency_key=key,
                    max_attempts=task.max_attempts,
                    traceparent=traceparent,
                    shadow=shadow,
                    partition_key=partition_key,
                    priority=priority,
                    concurrency_key=concurrency_key,
                    due=due,
                )
                for payload_json, key in checked
            ]
            try:
                outcomes = self._write_intents(session, task.name, checked, intents, now)
            except UNREACHABLE as exc:  # other errors are the caller's transaction's to handle
                raise database_error(exc, self.runtime.store.engine) from exc
            if len(outcomes) == 1:
                span.set_attributes(
                    {"durable_tasks.task.id": outcomes[0].task_id, "durable_tasks.created": outcomes[0].created}
                )
            else:
                span.set_attribute("durable_tasks.batch_size", len(outcomes))
        if created := sum(o.created for o in outcomes):
            telemetry.submitted.add(created, {"queue": task.queue, "task": task.name})
        return [TaskHandle(o.task_id, task.name, o.generation, o.created, self.results) for o in outcomes]

    def _write_intents(
        self, session: Session, name: str, checked: list[tuple[str, str | None]], intents: list[NewTask], now: datetime
    ) -> list[SubmitOutcome]:
        """The store's submit, then the payload check of repeated keys (a read only when a key
        was a duplicate); on a conflict the rows this call inserted are deleted again, so the
        caller's transaction holds nothing of the batch."""
        outcomes = self.runtime.store.submit_many(session, intents, now)
        try:
            check_same_payloads(session, name, checked, outcomes)
        except IdempotencyConflictError:
            undo_submits(session, [o.task_id for o in outcomes if o.created])
            raise
        if any(o.created for o in outcomes):
            self.runtime.publish_after_commit(session, self.runtime.first_deliveries(intents, outcomes, now))
        return outcomes

    async def asubmit(
        self, session: AsyncSession, task: Task[Any, Any] | str, payload: Any, **options: Unpack[SubmitOptions]
    ) -> TaskHandle:
        """:meth:`submit` with SQLAlchemy's ``AsyncSession`` (SQLModel's too): the same
        statements on the session's own connection (``AsyncSession.run_sync``), in its
        transaction; the caller commits. ``options`` are :meth:`submit`'s."""
        return await session.run_sync(lambda sync_session: self.submit(sync_session, task, payload, **options))

    def handle(self, task_id: str) -> TaskHandle:
        """A handle on a task submitted elsewhere (another process, an earlier request), to
        wait for its result; TaskNotFoundError if there is no such task."""
        name, generation = self.results.identity(task_id)
        return TaskHandle(task_id, name, generation, False, self.results)

    def _task(self, task: Task[Any, Any] | str) -> Task[Any, Any]:
        if isinstance(task, str):
            found = self._registry.get(task)
            if found is None:
                raise UnknownTaskError(f"no task named {task!r}; registered: {sorted(self._registry)}")
            return found
        return task

    def _checked_item(self, task: Task[Any, Any], index: int, item: Any) -> tuple[str, str | None]:
        """One (payload JSON, key) of a submit, checked; a typed error names the bad item."""
        if not (isinstance(item, tuple) and len(item) == 2):
            raise PayloadError(f"item {index} of submit_many is not a (payload, idempotency_key) pair")
        payload, key = item
        self._check_idempotency_key(key)
        s = self.settings
        payload_json = codec.encode_payload(
            task.payload_adapter, payload, task=task.name, max_bytes=s.max_payload_bytes, max_depth=s.max_json_depth
        )
        return payload_json, key

    def _check_idempotency_key(self, key: str | None) -> None:
        if key is None:
            return
        limit = self.settings.max_idempotency_key_length
        if not key.strip():
            raise InvalidIdempotencyKeyError("idempotency_key is empty; pass None or a stable request id")
        if len(key) > limit:
            raise InvalidIdempotencyKeyError(f"idempotency_key is {len(key)} characters, over {limit}; hash it")
        categories = {unicodedata.category(c) for c in key}
        if "Cc" in categories:
            raise InvalidIdempotencyKeyError("idempotency_key contains control characters; strip or hash it")
        if "Cs" in categories:  # what surrogateescape makes of bytes that are not UTF-8
            raise InvalidIdempotencyKeyError(
                "idempotency_key contains a lone surrogate, which is not text; "
                "decode it with errors='replace' or hash it"
            )

    def rerun(
        self,
        session: Session,
        task_id: str,
        *,
        delay: timedelta | None = None,
        not_before: datetime | None = None,
    ) -> int:
        """Start a new generation (rejudge, retry-from-here) in ``session``'s transaction, due
        now or after ``delay`` / at ``not_before``.

        Returns the new generation; executions of older generations are fenced out.
        """
        check_session(session, "rerun")
        now = self.clock()
        due = due_time(now, delay=delay, not_before=not_before)
        with self._database_errors():
            generation = (
                self.runtime.store.rerun(session, self.settings.namespace, task_id, now, due=due)
                if is_task_id_shaped(task_id)
                else None
            )
        if generation is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        self.runtime.wake_dispatchers_after_commit(session)
        return generation

    def cancel(self, session: Session, task_id: str) -> bool:
        """Cancel a task in ``session``'s transaction; False if it already has a final state.

        A running attempt keeps running but its result is fenced out.
        """
        check_session(session, "cancel")
        with self._database_errors():
            cancelled = (
                self.runtime.store.cancel(session, self.settings.namespace, task_id, self.clock())
                if is_task_id_shaped(task_id)
                else None
            )
        if cancelled is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return cancelled
