"""Read models returned to callers: a task with its history, per-queue statistics."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from .records import AttemptOutcome, AttemptRecord, TaskRecord, TaskState

__all__ = ["AttemptInfo", "PendingApproval", "QueueStats", "StepInfo", "TaskInfo"]


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One execution attempt, as the audit trail records it."""

    generation: int
    attempt: int
    delivery: int
    worker_id: str
    started_at: datetime
    finished_at: datetime | None
    #: How it ended; None while it runs.
    outcome: AttemptOutcome | None
    error_type: str | None
    error_message: str | None
    retry_reason: str | None
    #: The failure's traceback (chained causes included), secrets masked, at most 8 KB: its
    #: end is kept. None for an attempt that did not fail.
    traceback: str | None = None

    @classmethod
    def from_record(cls, r: AttemptRecord) -> AttemptInfo:
        """Build from a ``dt_attempts`` row."""
        return cls(
            r.generation,
            r.attempt,
            r.delivery,
            r.worker_id,
            r.started_at,
            r.finished_at,
            None if r.outcome is None else AttemptOutcome(r.outcome),
            r.error_type,
            r.error_message,
            r.retry_reason,
            r.traceback,
        )


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task's current state, outcome and full attempt history."""

    id: str
    name: str
    queue: str
    state: TaskState
    generation: int
    attempt: int
    delivery: int
    reclaims: int
    idempotency_key: str | None
    payload: Any
    result: Any
    error_type: str | None
    error_message: str | None
    shadow: bool
    created_at: datetime
    enqueued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempts: tuple[AttemptInfo, ...]

    @classmethod
    def from_records(cls, t: TaskRecord, attempts: list[AttemptRecord]) -> TaskInfo:
        """Build from a ``dt_tasks`` row and its ``dt_attempts`` rows."""
        return cls(
            id=t.id,
            name=t.name,
            queue=t.queue,
            state=TaskState(t.state),
            generation=t.generation,
            attempt=t.attempt,
            delivery=t.delivery,
            reclaims=t.reclaims,
            idempotency_key=t.idempotency_key,
            payload=_loads_or_raw(t.payload),
            result=None if t.result is None else _loads_or_raw(t.result),
            error_type=t.error_type,
            error_message=t.error_message,
            shadow=t.shadow,
            created_at=t.created_at,
            enqueued_at=t.enqueued_at,
            started_at=t.started_at,
            finished_at=t.finished_at,
            attempts=tuple(AttemptInfo.from_record(a) for a in attempts),
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Named numbers for one queue (the CLI's ``status`` prints the same)."""

    outbox_backlog: int
    outbox_oldest_age_s: float
    pel_size: int
    queue_delay_s: float
    oldest_pending_age_s: float
    dlq_length: int
    stream_lag: int = 0
    #: Outbox rows held PENDING because the dispatcher does not register their task's name
    #: (a rolling deploy; dead-lettered after ``unknown_task_grace``).
    unknown_held: int = 0
    #: Tasks a worker has claimed and not yet ended, as the database says (RUNNING).
    running: int = 0

    def as_dict(self) -> dict[str, float]:
        """The numbers by name."""
        return asdict(self)


def _loads_or_raw(text: str) -> Any:
    """Stored JSON, or the raw text when a row was edited into something unreadable (an
    operator must still be able to look at it)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """An approval a suspended task waits for: answer it with ``app.approve(task_id, name)``."""

    id: int
    task_id: str
    task_name: str
    generation: int
    name: str
    request: Any
    since: datetime

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (the time as ISO 8601)."""
        out = asdict(self)
        out["since"] = self.since.isoformat()
        return out


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One row of a task's step journal: a recorded step, a child's outcome, a signal, or a
    wait still open (``done`` false)."""

    slot: str
    kind: str
    label: str
    done: bool
    result: Any
    child_task_id: str | None
    child_state: str | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None
