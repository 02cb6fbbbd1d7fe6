"""Durable agent runs: turns and tool calls as tasks, fenced by the run's generation."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskNotFoundError
from durable_tasks.agents import Agent, ModelTurn, RunInfo, ScriptedModel, ToolCall
from durable_tasks.web import create_app
from tests.helpers import run_until_quiet

pytestmark = pytest.mark.anyio


class Calc(BaseModel):
    a: float
    b: float
    op: str


class Key(BaseModel):
    key: str


def tool_messages(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}


def script(messages: list[dict[str, Any]]) -> ModelTurn:
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn == 0:
        return ModelTurn(
            content="let me compute",
            tool_calls=[
                ToolCall(id="call_calc", name="calculator", arguments={"a": 2, "b": 3, "op": "+"}),
                ToolCall(id="call_kv", name="lookup", arguments={"key": "capital:fr"}),
                ToolCall(id="call_flaky", name="flaky", arguments={}),
                ToolCall(id="call_bad", name="calculator", arguments={"a": "two"}),
                ToolCall(id="call_ghost", name="no_such_tool", arguments={}),
            ],
        )
    results = tool_messages(messages)
    return ModelTurn(content=f"2+3={results['call_calc']['ok']}, capital={results['call_kv']['ok']}")


def build(app: App, model: ScriptedModel, executed: list[str]) -> Agent:
    agent = Agent(app, "helper", model)

    @agent.tool(description="arithmetic")
    def calculator(ctx: TaskContext[Any], args: Calc) -> float:
        executed.append("calculator")
        return args.a + args.b if args.op == "+" else args.a * args.b

    @agent.tool()
    def lookup(ctx: TaskContext[Any], args: Key) -> str:
        executed.append("lookup")
        return {"capital:fr": "Paris"}[args.key]

    @agent.tool(max_attempts=3)
    def flaky(ctx: TaskContext[Any], args: dict[str, Any]) -> str:
        executed.append(f"flaky#{ctx.attempt}")
        if ctx.attempt <= 2:
            raise ConnectionError("transient")
        return "finally"

    app.create_all()
    return agent


async def run_to_end(app: App, agent: Agent, question: str) -> RunInfo:
    """Start a run (committed), work until nothing is left, and return what it became."""
    with Session(app.engine) as s:
        run_id = agent.start(s, question)
        s.commit()
    await run_until_quiet(app)
    return agent.get_run(run_id)


async def test_a_run_executes_tools_and_answers(make_app: Callable[..., App]) -> None:
    app = make_app()
    model = ScriptedModel(script)
    executed: list[str] = []
    agent = build(app, model, executed)
    run = await run_to_end(app, agent, "what is 2+3 and the capital of France?")
    assert run.state == "DONE"
    assert run.output == "2+3=5.0, capital=Paris"
    assert model.calls == 2  # one call per turn
    results = run.turns[0]["tool_results"]
    assert results["call_calc"] == {"ok": 5.0}
    assert results["call_flaky"] == {"ok": "finally"}
    assert "invalid arguments" in results["call_bad"]["error"]  # recorded, not retried
    assert results["call_ghost"] == {"error": "unknown tool 'no_such_tool'"}
    assert sorted(executed) == ["calculator", "flaky#1", "flaky#2", "flaky#3", "lookup"]


async def test_retry_from_a_turn_fences_out_the_old_branch(make_app: Callable[..., App]) -> None:
    app = make_app()
    model = ScriptedModel(script)
    executed: list[str] = []
    agent = build(app, model, executed)
    with Session(app.engine) as s:
        run_id = agent.start(s, "go")
        s.commit()
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=5))  # turn 0 recorded; its tool calls are queued
    with Session(app.engine) as s:
        assert agent.retry_from(s, run_id, 0) == 1
        s.commit()
    await run_until_quiet(app)
    run = agent.get_run(run_id)
    assert (run.state, run.generation) == ("DONE", 1)
    assert model.calls == 3  # turn 0 twice (once per generation), then the answer
    assert executed.count("calculator") == 1  # generation 0's calls were cancelled before running


async def test_async_tools_and_repeated_call_ids(make_app: Callable[..., App]) -> None:
    app = make_app()

    def two_turns(messages: list[dict[str, Any]]) -> ModelTurn:
        if not any(m["role"] == "assistant" for m in messages):
            return ModelTurn(
                tool_calls=[
                    ToolCall(id="same", name="echo", arguments={"key": "a"}),
                    ToolCall(id="same", name="echo", arguments={"key": "b"}),  # a repeated id: still two calls
                ]
            )
        return ModelTurn(content="done")

    agent = Agent(app, "async", ScriptedModel(two_turns))
    seen: list[str] = []

    @agent.tool()
    async def echo(ctx: TaskContext[Any], args: Key) -> str:
        seen.append(args.key)
        return args.key.upper()

    app.create_all()
    run = await run_to_end(app, agent, "go")
    assert run.state == "DONE"
    assert sorted(seen) == ["a", "b"]


async def test_repeated_call_ids_each_get_their_own_result(make_app: Callable[..., App]) -> None:
    """Each call is its own task, keyed by its position: the model hears both results under the
    id it gave, and the run keeps both calls' tasks and results in call order."""
    app = make_app()
    heard: list[list[dict[str, Any]]] = []

    def two_turns(messages: list[dict[str, Any]]) -> ModelTurn:
        if not any(m["role"] == "assistant" for m in messages):
            return ModelTurn(
                tool_calls=[
                    ToolCall(id="same", name="echo", arguments={"key": "a"}),
                    ToolCall(id="same", name="echo", arguments={"key": "b"}),
                ]
            )
        heard.append([{"id": m["tool_call_id"], **json.loads(m["content"])} for m in messages if m["role"] == "tool"])
        return ModelTurn(content="done")

    agent = Agent(app, "repeat", ScriptedModel(two_turns))

    @agent.tool()
    def echo(ctx: TaskContext[Any], args: Key) -> str:
        return args.key.upper()

    app.create_all()
    run = await run_to_end(app, agent, "go")
    assert run.state == "DONE"
    assert heard == [[{"id": "same", "ok": "A"}, {"id": "same", "ok": "B"}]]
    calls = run.turns[0]["calls"]
    assert [(c["id"], c["result"]) for c in calls] == [("same", {"ok": "A"}), ("same", {"ok": "B"})]
    assert len({c["task_id"] for c in calls}) == 2
    assert [app.get_task(c["task_id"]).result for c in calls] == [{"ok": "A"}, {"ok": "B"}]
    page = TestClient(create_app(app)).get(f"/agents/{run.id}").text  # the dashboard shows each call's own
    assert (page.count('{"ok": "A"}'), page.count('{"ok": "B"}')) == (1, 1)


async def test_a_model_that_keeps_failing_ends_the_run_failed(make_app: Callable[..., App]) -> None:
    app = make_app()

    def broken(messages: list[dict[str, Any]]) -> ModelTurn:
        raise TimeoutError("model endpoint timed out")

    agent = Agent(app, "broken", ScriptedModel(broken), turn_max_attempts=2)
    app.create_all()
    run = await run_to_end(app, agent, "go")
    assert run.state == "FAILED"
    assert run.output is not None
    assert "model endpoint timed out" in run.output


@pytest.mark.parametrize("run_id", ["01a2\x00b", "01a2\udcffb", "r" * 37], ids=["nul", "lone-surrogate", "too-long"])
async def test_what_cannot_be_a_run_id_names_no_run(app: App, run_id: str) -> None:
    agent = build(app, ScriptedModel(script), [])
    with pytest.raises(TaskNotFoundError, match="no agent run"):
        agent.get_run(run_id)
    with Session(app.engine) as session, pytest.raises(TaskNotFoundError, match="no agent run"):
        agent.retry_from(session, run_id, 0)
