"""The App's face to the step journal: signals, approvals, and reading a task's journal.

A task suspended on ``journal.wait_signal(name)`` (an agent's tool call that needs approval, for
instance) resumes when ``app.signal(task_id, name, payload)`` delivers it, from any process. A
signal is a named fact of the task's current generation: the first payload stays, and a signal
sent before the task waits for it is there when it does.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .codec import utf8_length
from .errors import SignalError, TaskNotFoundError
from .journal import StepKind, check_signal_name
from .store.ids import is_task_id_shaped
from .views import PendingApproval, StepInfo

if TYPE_CHECKING:
    from .clock import Clock
    from .runtime import Runtime
    from .settings import Settings

__all__ = ["SignalsMixin"]


class SignalsMixin:
    """Signals, approvals and journals; mixed into :class:`~durable_tasks.App`."""

    runtime: Runtime
    settings: Settings
    clock: Clock

    def _database_errors(self) -> AbstractContextManager[None]:  # pragma: no cover - the App's
        raise NotImplementedError

    def signal(self, task_id: str, name: str, payload: Any = None) -> bool:
        """Deliver the signal ``name`` with ``payload`` (plain JSON) to the task's current
        generation, in a transaction of its own; a task waiting for it (and for nothing else)
        resumes. Returns False when that signal was delivered before (the first payload stays)."""
        check_signal_name(name)
        try:
            payload_json = json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SignalError(
                f"signal {name!r}: the payload is not plain JSON ({exc}); send dicts, lists, text"
            ) from exc
        if (size := utf8_length(payload_json)) > self.settings.max_payload_bytes:
            raise SignalError(
                f"signal {name!r}: the payload is {size} bytes of JSON, over max_payload_bytes="
                f"{self.settings.max_payload_bytes}; store large data elsewhere and send its key"
            )
        with self._database_errors():
            delivered = (
                self.runtime.store.deliver_signal(self.settings.namespace, task_id, name, payload_json, self.clock())
                if is_task_id_shaped(task_id)
                else None
            )
        if delivered is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return delivered

    def approve(
        self, task_id: str, name: str, *, approved: bool = True, reason: str | None = None, by: str | None = None
    ) -> bool:
        """Answer an approval (``approved=False`` denies it, telling the agent ``reason``); the
        signal ``{"approved": ..., "reason": ..., "by": ...}``. False when it was answered before."""
        return self.signal(task_id, name, {"approved": approved, "reason": reason, "by": by})

    def open_approvals(self, *, limit: int = 50, after: int = 0) -> list[PendingApproval]:
        """Approvals suspended tasks wait for, oldest first: ``limit`` of them after the id ``after``
        (pass the last one's ``id`` for the next page)."""
        with self._database_errors():
            waits = self.runtime.store.open_waits(
                self.settings.namespace, kinds=[StepKind.APPROVAL], limit=limit, after_id=after
            )
        return [
            PendingApproval(
                w.id,
                w.task_id,
                w.task_name,
                w.generation,
                w.name,
                json.loads(w.request_json) if w.request_json else None,
                w.since,
            )
            for w in waits
        ]

    def steps(self, task_id: str) -> list[StepInfo]:
        """The journal of the task's current generation, in the order it was written: recorded
        steps, children with their outcome, signals, and the waits still open."""
        with self._database_errors():
            found = (
                self.runtime.store.list_steps(self.settings.namespace, task_id) if is_task_id_shaped(task_id) else None
            )
        if found is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return found
