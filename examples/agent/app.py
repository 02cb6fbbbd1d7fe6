"""The assistant agent: four tools, a deterministic scripted model, and ``build(**settings)``.

Every model turn and every tool call is a durable task (see ``durable_tasks.agents``): a
recorded turn is never sent to the model again, a tool call whose result is committed never
runs again, and whatever a crash interrupts runs again under a fence.

The tools show the three ways a tool call can end:

- ``calculator`` and ``kv_lookup`` fail *for good* on a bad request (division by zero, an
  unknown key): only ``OSError`` is retried, so the error goes back to the model at once;
- ``flaky_search`` fails *transiently* (``ConnectionError``) on its first two attempts and is
  retried by the runtime, up to ``max_attempts=3``;
- ``slow_report`` sleeps ``AGENT_SLOW_SECONDS`` (default 0) first: the crash test kills the
  process while it sleeps, and the recovered run finishes it without a second model call.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_tasks import App, TaskContext
from durable_tasks.agents import Agent, ChatModel, ModelTurn, ScriptedModel, ToolCall

__all__ = [
    "AGENT_NAME",
    "CALL_LOG_ENV",
    "EXPECTED_ANSWER",
    "FACTS",
    "QUESTION",
    "SLOW_SECONDS_ENV",
    "CalculatorArgs",
    "LookupArgs",
    "ReportArgs",
    "SearchArgs",
    "build",
    "install_agent",
    "script",
    "scripted_model",
]

AGENT_NAME = "assistant"
#: Seconds ``slow_report`` sleeps before it answers (read on every call).
SLOW_SECONDS_ENV = "AGENT_SLOW_SECONDS"
#: When set, the scripted model appends ``{"turn": n}`` to this file on every call.
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

#: The scripted model's final answer to :data:`QUESTION` (or to any question: it is a script).
EXPECTED_ANSWER = (
    f"6 * 7 = 42; the capital of France is Paris; top search hit: {SEARCH_HITS[0]}; report: REPORT (3 findings)"
)


class _Args(BaseModel):
    # extra="forbid": arguments the model invented (or {"__invalid_json__": raw} from an adapter
    # that could not parse them) fail validation and go back to the model as an error.
    model_config = ConfigDict(extra="forbid")


class CalculatorArgs(_Args):
    """``a op b``."""

    a: float
    b: float
    op: Literal["+", "-", "*", "/"]


class LookupArgs(_Args):
    """A fact's key."""

    key: str = Field(description=f"one of {sorted(FACTS)}")


class SearchArgs(_Args):
    """A search query."""

    query: str


class ReportArgs(_Args):
    """What the report summarises."""

    title: str
    findings: list[str]


def install_agent(app: App, model: ChatModel | None = None) -> Agent:
    """Register the ``assistant`` agent and its tools on ``app`` (the scripted model by default)."""
    agent = Agent(app, AGENT_NAME, model if model is not None else scripted_model())

    @agent.tool(description="Evaluate a op b for op in + - * /.", retry_on=(OSError,))
    def calculator(ctx: TaskContext[Any], args: CalculatorArgs) -> float:
        if args.op == "+":
            return args.a + args.b
        if args.op == "-":
            return args.a - args.b
        if args.op == "*":
            return args.a * args.b
        if args.b == 0:
            # Not OSError, so not retried: the task fails at once and the model reads the error.
            raise ZeroDivisionError("division by zero")
        return args.a / args.b

    @agent.tool(description="Look up a fact by key.", retry_on=(OSError,))
    def kv_lookup(ctx: TaskContext[Any], args: LookupArgs) -> str:
        try:
            return FACTS[args.key]
        except KeyError:
            raise LookupError(f"no fact named {args.key!r}; known: {sorted(FACTS)}") from None

    @agent.tool(description="Search the web (flaky).", max_attempts=3, retry_on=(ConnectionError,))
    def flaky_search(ctx: TaskContext[Any], args: SearchArgs) -> list[str]:
        # ctx.attempt comes from the database, so "the first two attempts fail" holds across
        # processes and restarts. A real tool would send ctx.idempotency_token downstream.
        if ctx.attempt <= 2:
            raise ConnectionError(f"search backend unreachable (attempt {ctx.attempt})")
        return [hit for hit in SEARCH_HITS if any(w in hit.lower() for w in args.query.lower().split())]

    @agent.tool(description="Write a report from findings (slow).")
    def slow_report(ctx: TaskContext[Any], args: ReportArgs) -> str:
        # A sync tool runs in a worker thread; the runtime heartbeats its lease meanwhile.
        time.sleep(float(os.environ.get(SLOW_SECONDS_ENV, "0") or 0))
        return f"REPORT ({len(args.findings)} findings)"

    return agent


def build(model: ChatModel | None = None, **settings: Any) -> tuple[App, Agent]:
    """``App(**settings)`` (``DT_*`` environment variables fill in what is not given) with the
    ``assistant`` agent installed."""
    app = App(**settings)
    return app, install_agent(app, model)


# -- the scripted model ------------------------------------------------------------------------


def scripted_model() -> ScriptedModel:
    """A deterministic model that follows :func:`script`."""
    return ScriptedModel(script)


def script(messages: list[dict[str, Any]]) -> ModelTurn:
    """Turn 0: calculator, kv_lookup and flaky_search in parallel; turn 1: slow_report over
    their results; turn 2: the final answer built from every tool result."""
    turn = sum(1 for m in messages if m["role"] == "assistant")
    _log_call(turn)
    results = _tool_results(messages)
    if turn == 0:
        return ModelTurn(
            content="I will compute, look up and search at the same time.",
            tool_calls=[
                ToolCall(id="call_calc", name="calculator", arguments={"a": 6, "b": 7, "op": "*"}),
                ToolCall(id="call_kv", name="kv_lookup", arguments={"key": "capital_of_france"}),
                ToolCall(id="call_search", name="flaky_search", arguments={"query": "durable execution"}),
            ],
        )
    if turn == 1:
        findings = [_show(results.get(c)) for c in ("call_calc", "call_kv", "call_search")]
        return ModelTurn(
            content="Now a report over what I found.",
            tool_calls=[
                ToolCall(id="call_report", name="slow_report", arguments={"title": "answers", "findings": findings})
            ],
        )
    search = results.get("call_search")
    hits = search.get("ok") if isinstance(search, dict) else None
    top = hits[0] if isinstance(hits, list) and hits else _show(search)
    return ModelTurn(
        content=(
            f"6 * 7 = {_show(results.get('call_calc'))}; the capital of France is {_show(results.get('call_kv'))}; "
            f"top search hit: {top}; report: {_show(results.get('call_report'))}"
        )
    )


def _tool_results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Every tool result so far, by tool call id (``{"ok": value}`` or ``{"error": text}``)."""
    return {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}


def _show(result: Any) -> str:
    """A tool result as text: the value (whole floats without ``.0``) or ``error: ...``."""
    if not isinstance(result, dict):
        return "no result"
    if "ok" not in result:
        return f"error: {result.get('error')}"
    value = result["ok"]
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return str(value)


def _log_call(turn: int) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if path:
        with Path(path).open("a", encoding="utf-8") as log:
            log.write(json.dumps({"turn": turn}) + "\n")
