"""The assistant: a pydantic-ai agent with four tools, made durable by ``DurableTasksDurability``.

``build(**settings)`` returns the App, the agent and the task that runs it (``agent.assistant``:
question in, answer out). The model is a deterministic script (pydantic-ai's ``FunctionModel``),
so the example runs offline; pass any pydantic-ai model to ``build(model=...)`` instead.

The tools show the ways a tool call can end:

- ``calculator`` and ``kv_lookup`` fail *for good* on a bad request (division by zero, an unknown
  key): only ``OSError`` retries, so the error goes back to the model at once;
- ``flaky_search`` fails *transiently* (``ConnectionError``) on its first two attempts and is
  retried by the runtime (``max_attempts=3``); the model never sees the failures;
- ``slow_report`` sleeps ``AGENT_SLOW_SECONDS`` (default 0) first: the crash test kills the process
  while it sleeps, and the recovered run finishes it without a second model call.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from durable_tasks import App, Task, TaskContext, current_task
from durable_tasks.integrations import ToolPolicy
from durable_tasks.integrations.pydantic_ai import DurableTasksDurability

__all__ = [
    "AGENT_NAME",
    "CALL_LOG_ENV",
    "EXPECTED_ANSWER",
    "FACTS",
    "QUESTION",
    "SLOW_SECONDS_ENV",
    "Assistant",
    "build",
    "script",
]

AGENT_NAME = "assistant"
#: Seconds ``slow_report`` sleeps before it answers (read on every call).
SLOW_SECONDS_ENV = "AGENT_SLOW_SECONDS"
#: When set, the scripted model appends ``{"turn": n}`` to this file each time it answers.
CALL_LOG_ENV = "AGENT_CALL_LOG"

QUESTION = "What is 6 * 7, what is the capital of France, and what do people say about durable execution?"

FACTS: dict[str, str] = {
    "capital_of_france": "Paris",
    "capital_of_japan": "Tokyo",
    "speed_of_light_km_s": "299792",
    "boiling_point_water_c": "100",
}

SEARCH_HITS = [
    "Durable execution: code that survives crashes by recording each step",
    "At-least-once delivery with idempotent, fenced results",
]

#: The scripted model's final answer (to any question: it is a script).
EXPECTED_ANSWER = (
    f"6 * 7 = 42; the capital of France is Paris; top search hit: {SEARCH_HITS[0]}; report: REPORT (3 findings)"
)

POLICIES = {
    "calculator": ToolPolicy(retry_on=(OSError,)),
    "kv_lookup": ToolPolicy(retry_on=(OSError,)),
    "flaky_search": ToolPolicy(max_attempts=3, retry_on=(ConnectionError,)),
}


@dataclass(frozen=True)
class Assistant:
    """The App, the agent, and the task that runs the agent on one question."""

    app: App
    agent: Agent[None, str]
    ask: Task[str, str]


def build(model: Model | None = None, **settings: Any) -> Assistant:
    """``App(**settings)`` (``DT_*`` variables fill in the rest) with the assistant registered."""
    app = App(**settings)
    durability = DurableTasksDurability(app, queue="agents", tool_policies=POLICIES)
    agent: Agent[None, str] = Agent(model or FunctionModel(script), name=AGENT_NAME, capabilities=[durability])

    @agent.tool_plain
    def calculator(a: float, b: float, op: Literal["+", "-", "*", "/"]) -> float:
        """Evaluate a op b."""
        if op == "/" and b == 0:
            raise ModelRetry("division by zero")  # the model's mistake: it hears about it
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0.0}[op]

    @agent.tool_plain
    def kv_lookup(key: str) -> str:
        """Look up a fact by key."""
        if key not in FACTS:
            raise ModelRetry(f"no fact named {key!r}; known: {sorted(FACTS)}")
        return FACTS[key]

    @agent.tool_plain
    def flaky_search(query: str) -> list[str]:
        """Search the web (flaky)."""
        task = current_task()  # the tool's own task: its attempt number comes from the database
        if task is not None and task.attempt <= 2:
            raise ConnectionError(f"search backend unreachable (attempt {task.attempt})")
        return [hit for hit in SEARCH_HITS if any(w in hit.lower() for w in query.lower().split())]

    @agent.tool_plain
    def slow_report(title: str, findings: list[str]) -> str:
        """Write a report from findings (slow)."""
        time.sleep(float(os.environ.get(SLOW_SECONDS_ENV, "0") or 0))
        return f"REPORT ({len(findings)} findings)"

    @app.task(name=f"agent.{AGENT_NAME}", queue="agents")
    async def ask(ctx: TaskContext[str], question: str) -> str:
        return (await agent.run(question)).output

    return Assistant(app, agent, ask)


# -- the scripted model ------------------------------------------------------------------------


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Turn 0: calculator, kv_lookup and flaky_search in parallel; turn 1: slow_report over their
    results; turn 2: the answer, built from every tool result."""
    turn = sum(1 for m in messages if isinstance(m, ModelResponse))
    results = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if turn == 0:
        response = ModelResponse(
            parts=[
                TextPart("I will compute, look up and search at the same time."),
                ToolCallPart("calculator", {"a": 6, "b": 7, "op": "*"}, tool_call_id="call_calc"),
                ToolCallPart("kv_lookup", {"key": "capital_of_france"}, tool_call_id="call_kv"),
                ToolCallPart("flaky_search", {"query": "durable execution"}, tool_call_id="call_search"),
            ]
        )
    elif turn == 1:
        findings = [_show(results.get(c)) for c in ("call_calc", "call_kv", "call_search")]
        response = ModelResponse(
            parts=[ToolCallPart("slow_report", {"title": "answers", "findings": findings}, tool_call_id="call_report")]
        )
    else:
        hits = results.get("call_search")
        top = hits[0] if isinstance(hits, list) and hits else _show(hits)
        calc, capital, report = (_show(results.get(c)) for c in ("call_calc", "call_kv", "call_report"))
        answer = f"6 * 7 = {calc}; the capital of France is {capital}; top search hit: {top}; report: {report}"
        response = ModelResponse(parts=[TextPart(answer)])
    _log_call(turn)
    return response


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return "no result" if value is None else str(value)


def _log_call(turn: int) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if path:
        with Path(path).open("a", encoding="utf-8") as log:
            log.write(json.dumps({"turn": turn}) + "\n")
