"""What both integrations share: per-tool delivery policy, failure handling, slot and signal names."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ChildTaskFailedError

if TYPE_CHECKING:
    from ..journal import Journal

__all__ = [
    "DEFAULT_POLICY",
    "FailureMode",
    "ToolPolicy",
    "approval_signal",
    "failure_message",
    "hands_to_model",
    "tool_label",
    "tool_task_name",
]

#: What a tool call that did not succeed does to the run: ``"model"`` hands the error to the
#: model as the tool's result (it may try something else), ``"fail"`` ends the run FAILED with
#: the reason.
FailureMode = Literal["model", "fail"]


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How a tool's child task is delivered: attempts, per-attempt timeout, which errors retry,
    and what a failure (retries spent) or a dead-lettering (its workers kept dying) does to the run."""

    max_attempts: int = 3
    timeout: timedelta | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    on_failure: FailureMode = "model"
    on_dead_letter: FailureMode = "fail"


#: The policy of a tool nobody configured.
DEFAULT_POLICY = ToolPolicy()


def policy_for(name: str, default: ToolPolicy, overrides: Mapping[str, ToolPolicy]) -> ToolPolicy:
    """The tool's own policy, else the default."""
    return overrides.get(name, default)


def hands_to_model(policy: ToolPolicy, error: ChildTaskFailedError) -> bool:
    """Whether ``error`` goes back to the model (True) or ends the run (False)."""
    mode = policy.on_dead_letter if error.state == "DEAD" else policy.on_failure
    return mode == "model"


def failure_message(tool: str, error: ChildTaskFailedError) -> str:
    """What the model reads when a tool call did not succeed."""
    if error.state == "DEAD":
        return f"tool {tool} could not run: its workers were lost repeatedly ({error.error_message})"
    if error.state == "CANCELLED":
        return f"tool {tool} was cancelled"
    return f"tool {tool} failed: {error.error_type}: {error.error_message}"


def tool_label(tool: str, call_id: str | None, args: Any) -> str:
    """The journal label of one tool call: the tool, the model's call id and a digest of the
    arguments, so parallel calls get the same slots on every replay whatever order they start in
    (a model that repeats an id still gets one slot per distinct call)."""
    digest = hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"tool:{tool}:{call_id or '-'}:{digest}"


def tool_task_name(framework: str, agent: str, tool: str) -> str:
    """The registered task that runs one tool, e.g. ``pydantic_ai.helper.tool.search``."""
    return f"{framework}.{agent}.tool.{tool}"


def approval_signal(journal: Journal, call_id: str | None) -> str:
    """The signal one request for approval waits for: ``approval:<call id>``, then
    ``approval:<call id>#<n>`` for the n-th later request under the same id in the generation.
    A signal is answered once per generation, so a model that reuses a call id in a later turn
    must not find that turn's call approved already; every replay numbers the requests alike."""
    n = journal.sequence(f"approval:{call_id}")
    return f"approval:{call_id}" if n == 0 else f"approval:{call_id}#{n}"
