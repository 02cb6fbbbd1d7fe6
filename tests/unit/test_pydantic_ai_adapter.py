"""The pydantic-ai adapter over the journal (pure logic: an in-memory journal store drives
real pydantic-ai code with a FunctionModel; the runtime's own store is tested in
tests/integration/test_agent_frameworks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from durable_tasks import App, TaskContext
from durable_tasks.integrations import ToolPolicy
from durable_tasks.integrations.pydantic_ai import DurableTasksDurability
from tests.journal_fake import FakeStore, drive

pytestmark = pytest.mark.anyio


def build(tmp_path: Path) -> tuple[App, Agent[None, str], list[int], list[str]]:
    app = App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://127.0.0.1:1", "unit")
    turns: list[int] = []
    effects: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        turns.append(turn)
        if turn == 0:
            return ModelResponse(
                parts=[
                    ToolCallPart("add", {"a": 1, "b": 2}, tool_call_id="c1"),
                    ToolCallPart("add", {"a": "one", "b": 2}, tool_call_id="c2"),
                    ToolCallPart("flaky", {}, tool_call_id="c3"),
                    ToolCallPart("add", {"a": 3, "b": 4}, tool_call_id="c4"),
                ]
            )
        returns = {
            p.tool_call_id: p.content
            for m in messages
            for p in getattr(m, "parts", [])
            if isinstance(p, ToolReturnPart | RetryPromptPart)
        }
        return ModelResponse(
            parts=[TextPart(f"{returns['c1']} {returns['c3']} {returns['c4']} retry={'c2' in returns}")]
        )

    durability = DurableTasksDurability(app, tool_policies={"flaky": ToolPolicy(max_attempts=3)})
    agent: Agent[None, str] = Agent(FunctionModel(model), name="helper", capabilities=[durability])
    attempts = {"flaky": 0}

    @agent.tool_plain
    async def add(a: int, b: int) -> int:
        effects.append(f"add {a} {b}")
        return a + b

    @agent.tool_plain
    async def flaky() -> str:
        attempts["flaky"] += 1
        effects.append(f"flaky#{attempts['flaky']}")
        if attempts["flaky"] < 3:
            raise ConnectionError("try again")
        return "ok"

    return app, agent, turns, effects


async def test_each_turn_reaches_the_model_once_and_each_tool_runs_once(tmp_path: Path) -> None:
    app, agent, turns, effects = build(tmp_path)

    @app.task(name="agent.helper")
    async def run_helper(ctx: TaskContext[str], prompt: str) -> str:
        return (await agent.run(prompt)).output

    store = FakeStore(app)
    run = await drive(store, run_helper, "go")
    assert run.result == "3 ok 7 retry=True"
    assert turns == [0, 1]  # the replays read turn 0 from the journal
    assert sorted(effects) == ["add 1 2", "add 3 4", "flaky#1", "flaky#2", "flaky#3"]
    assert run.attempts == 2  # suspended once for the tools, then answered
    assert [label.split(":")[1:3] for label in run.started] == [["add", "c1"], ["flaky", "c3"], ["add", "c4"]]


async def test_a_tool_needing_approval_waits_for_its_signal(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://127.0.0.1:1", "unit")
    turns: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turns.append(len(turns))
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("refund", {"amount": 30}, tool_call_id="r1")])
        last = messages[-1]
        return ModelResponse(parts=[TextPart(str(getattr(last, "parts", [None])[0].content))])

    agent: Agent[None, str] = Agent(FunctionModel(model), name="support", capabilities=[DurableTasksDurability(app)])
    refunds: list[int] = []

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        refunds.append(amount)
        return f"refunded {amount}"

    @app.task(name="agent.support")
    async def run_support(ctx: TaskContext[str], prompt: str) -> str:
        return (await agent.run(prompt)).output

    store = FakeStore(app)
    waiting = await drive(store, run_support, "refund order 7")
    assert waiting.result is None
    [wait] = waiting.waiting_for
    assert (wait.name, wait.kind) == ("approval:r1", "approval")
    assert wait.request_json is not None
    assert '"amount": 30' in wait.request_json
    assert refunds == []

    done = await drive(store, run_support, "refund order 7", resume=True, signals={"approval:r1": {"approved": True}})
    assert done.result == "refunded 30"
    assert refunds == [30]
    assert turns == [0, 1]
