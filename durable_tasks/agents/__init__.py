"""Durable tool calls for agent frameworks, with any model client.

An agent run and its turns are durable records. Recording a model turn writes the turn and
one durable task per tool call in ONE transaction (the fenced result transaction of the turn
task); the tool call's position in the turn is its idempotency key within the run (the id the
model returned may repeat or be unusable as a key; it stays in the payload). When every
tool call of a turn has settled, the next model turn is scheduled in the same transaction as
the last tool result. So, after a crash at any point:

- a turn whose output is recorded is never sent to the model again (the turn task committed);
- a tool call whose result is committed never runs again (its task is final);
- everything in between is at-least-once and fenced, like any task.

``retry_from(run, turn)`` starts a new run generation from a turn: the superseded branch's
pending tasks are cancelled (a running one is fenced out) and its late results are ignored.
"""

from ..records import AgentRun, AgentTurn
from .agent import Agent
from .model import ChatModel, ModelTurn, RunInfo, ScriptedModel, ToolCall, ToolSpec

__all__ = [
    "Agent",
    "AgentRun",
    "AgentTurn",
    "ChatModel",
    "ModelTurn",
    "RunInfo",
    "ScriptedModel",
    "ToolCall",
    "ToolSpec",
]
