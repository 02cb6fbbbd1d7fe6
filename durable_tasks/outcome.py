"""A task's outcome as a result wait sees it, and the message that announces outcomes.

After a fenced commit settles tasks (a result, a final failure, a dead letter), the process
that committed publishes ONE message for the whole group on the namespace's outcome channel
(:func:`durable_tasks.transport.keys.outcome_channel`). Each entry carries the task's final
state and, when it is small, its result or error, so a waiter that was woken by it needs no
database query. A larger result is left out (``complete`` is False) and the waiter reads it.

The message is JSON: ``{"o": [[task_id, generation, state, result_json, error_type,
error_message, complete], ...]}`` (``result_json`` is the result's JSON text, as stored).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .records import TERMINAL_STATES, TaskState

__all__ = ["TaskOutcome", "decode_outcomes", "encode_outcomes"]


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What is known of one task: its generation and state, and for a final state its result
    (SUCCEEDED) or error. ``complete`` is False when a message left the result or error out."""

    task_id: str
    generation: int
    state: TaskState
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    complete: bool = True

    @property
    def final(self) -> bool:
        """Whether the task has reached a terminal state in this generation."""
        return self.state in TERMINAL_STATES


def encode_outcomes(outcomes: Iterable[TaskOutcome], *, inline_bytes: int) -> str:
    """One message for a group of final outcomes; a result or error message longer than
    ``inline_bytes`` characters is left out (the waiter reads it from the database)."""
    entries: list[list[object]] = []
    for o in outcomes:
        size = len(o.result_json or "") + len(o.error_message or "")
        inline = o.complete and size <= inline_bytes
        entries.append(
            [
                o.task_id,
                o.generation,
                str(o.state),
                o.result_json if inline else None,
                o.error_type,
                o.error_message if inline else None,
                inline,
            ]
        )
    return json.dumps({"o": entries}, separators=(",", ":"))


def decode_outcomes(message: str | bytes) -> list[TaskOutcome]:
    """The outcomes of one message; a malformed message or entry yields nothing (a waiter then
    learns the outcome from its fallback read)."""
    try:
        entries = json.loads(message)["o"]
    except (ValueError, KeyError, TypeError):
        return []
    if not isinstance(entries, list):
        return []
    return [o for o in map(_entry, entries) if o is not None]


def _entry(raw: object) -> TaskOutcome | None:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) != 7:
        return None
    task_id, generation, state, result_json, error_type, error_message, complete = raw
    try:
        parsed_state = TaskState(state)
    except ValueError:
        return None
    if not isinstance(task_id, str) or not isinstance(generation, int) or not isinstance(complete, bool):
        return None
    if not all(v is None or isinstance(v, str) for v in (result_json, error_type, error_message)):
        return None
    return TaskOutcome(task_id, generation, parsed_state, result_json, error_type, error_message, complete)
