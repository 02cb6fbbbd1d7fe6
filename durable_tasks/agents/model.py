"""What an agent exchanges: messages, the model's turns and tool calls, the tools as the
model sees them, the payloads of the turn and tool tasks, and a run as read back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

__all__ = [
    "ChatModel",
    "Message",
    "ModelTurn",
    "RunInfo",
    "ScriptedModel",
    "ToolCall",
    "ToolRequest",
    "ToolSpec",
    "TurnRequest",
]

Message = dict[str, Any]


class ToolCall(BaseModel):
    """One tool call as the model asked for it."""

    id: str
    name: str
    arguments: dict[str, Any]


class ModelTurn(BaseModel):
    """What the model said in one turn: text, tool calls, or both."""

    content: str | None = None
    tool_calls: list[ToolCall] = []


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a model sees it: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


class ChatModel(Protocol):
    """Any model client: messages (OpenAI chat shape) and tool specs in, one turn out."""

    def complete(self, messages: list[Message], tools: Sequence[ToolSpec]) -> ModelTurn: ...


class ScriptedModel:
    """A deterministic model for tests and demos: ``script(messages) -> ModelTurn``."""

    def __init__(self, script: Callable[[list[Message]], ModelTurn]) -> None:
        self.script = script
        self.calls = 0

    def complete(self, messages: list[Message], tools: Sequence[ToolSpec]) -> ModelTurn:
        """Answer from the script."""
        self.calls += 1
        return self.script(messages)


class TurnRequest(BaseModel):
    """Payload of a turn task."""

    run_id: str
    generation: int
    index: int


class ToolRequest(BaseModel):
    """Payload of a tool task."""

    run_id: str
    generation: int
    turn: int
    call_id: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run as recorded: state, answer, and each turn with its tool results."""

    id: str
    state: str
    generation: int
    output: str | None
    turns: list[dict[str, Any]]
