"""Journal-based agent runs as the dashboard shows them: the open approvals (what
``durable-tasks approvals list`` reads, through the same ``App.open_approvals``: a keyed page of
the partial index of open waits) and one run's journal (its task and ``dt_steps`` rows)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import TaskNotFoundError
from ..journal import StepKind
from .paging import PAGE_SIZE, Page

if TYPE_CHECKING:
    from ..app import App
    from ..views import PendingApproval, StepInfo, TaskInfo

__all__ = ["JournalRun", "journal_run", "open_approvals"]


def open_approvals(app: App, *, after: int = 0, limit: int = PAGE_SIZE) -> Page[PendingApproval]:
    """Open approvals, oldest first, ``limit`` after the id ``after``; the next page's cursor is
    the last one's id."""
    found = app.open_approvals(limit=limit, after=after)
    return Page(found, str(found[-1].id) if len(found) == limit else None)


@dataclass(frozen=True, slots=True)
class JournalRun:
    """A task that keeps a step journal: its state, its steps (model requests, tool-call child
    tasks, signals) with their results read as JSON, and the approvals it waits for."""

    task: TaskInfo
    steps: list[dict[str, Any]]
    waiting_for: list[str]


def journal_run(app: App, task_id: str) -> JournalRun | None:
    """The run of ``task_id`` from its journal, or None when there is no such task or it has
    no journal."""
    try:
        steps = app.steps(task_id)
        if not steps:
            return None
        task = app.get_task(task_id)
    except TaskNotFoundError:
        return None
    waiting = [s.label for s in steps if s.kind == StepKind.APPROVAL.value and not s.done]
    return JournalRun(task, [_step_view(s) for s in steps], waiting)


def _step_view(step: StepInfo) -> dict[str, Any]:
    """A step with its result read (text left as is when it is not JSON)."""
    result: Any = step.result
    if isinstance(result, str):
        with contextlib.suppress(ValueError):
            result = json.loads(result)
    return {
        "slot": step.slot,
        "kind": step.kind,
        "label": step.label,
        "done": step.done,
        "result": result,
        "child_task_id": step.child_task_id,
        "child_state": step.child_state,
        "error": step.error,
        "created_at": step.created_at,
        "finished_at": step.finished_at,
    }
