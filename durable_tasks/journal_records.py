"""What the step journal records and the store operations it needs (see :mod:`.journal`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

__all__ = [
    "ChildOutcome",
    "JournalBackend",
    "PendingChild",
    "PendingSignal",
    "PreparedChild",
    "RecordedStep",
    "StepKind",
    "Suspended",
]


class StepKind(StrEnum):
    """What a journal row records."""

    STEP = "step"
    CHILD = "child"
    SIGNAL = "signal"
    APPROVAL = "approval"  # a signal a person answers; the approvals CLI lists these


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How a child task ended: its state and its result or error."""

    state: str  # SUCCEEDED, FAILED, DEAD or CANCELLED
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One ``dt_steps`` row as the journal reads it; ``done`` False: still awaited."""

    slot: str
    kind: StepKind
    done: bool
    result_json: str | None = None
    child: ChildOutcome | None = None


@dataclass(frozen=True, slots=True)
class PreparedChild:
    """A child's task name and its validated payload, ready for the suspension's transaction."""

    task_name: str
    payload_json: str


@dataclass(slots=True)
class PendingChild:
    """A child call waiting for its outcome: submitted with the suspension."""

    slot: str
    label: str
    prepared: PreparedChild
    order: tuple[int, int]


@dataclass(slots=True)
class PendingSignal:
    """A signal wait: recorded with the suspension, listed by the approvals CLI."""

    slot: str
    name: str
    kind: StepKind
    request_json: str | None
    order: tuple[int, int]


class Suspended(StrEnum):
    """What a suspension became (the backend's answer)."""

    WAITING = "waiting"  # WAITING until the last awaited thing settles
    REDELIVERED = "redelivered"  # everything had settled meanwhile: a new delivery now


class JournalBackend(Protocol):
    """The store operations one attempt's journal uses, each one fenced by that attempt."""

    async def load(self) -> Sequence[RecordedStep]:
        """Every row of the task's current generation."""
        ...

    async def record_step(self, slot: str, label: str, result_json: str) -> str:
        """Record a step's result; returns the recorded result (an earlier row wins). Raises
        :class:`~.errors.JournalFencedOutError` once the attempt no longer owns the task."""
        ...

    def prepare_child(self, task: Any, payload: Any) -> PreparedChild:
        """Validate a child's payload (typed errors, nothing written)."""
        ...

    async def suspend(self, children: Sequence[PendingChild], signals: Sequence[PendingSignal]) -> Suspended:
        """Submit ``children`` (idempotently), record the waits, and move the task to WAITING
        (or redeliver it when nothing is left to wait for): one fenced transaction."""
        ...
