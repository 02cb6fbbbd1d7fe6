"""The OpenAI Agents SDK adapter over the journal (pure logic: an in-memory journal store
drives the real Runner with a scripted Model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, function_tool

from durable_tasks import App, TaskContext
from durable_tasks.integrations import ToolPolicy
from durable_tasks.integrations.openai_agents import DurableRunner
from tests.agents_sdk_scripts import ScriptedModel, bad_call, call, outputs, say
from tests.journal_fake import FakeStore, drive

pytestmark = pytest.mark.anyio


async def test_each_turn_reaches_the_model_once_and_each_tool_runs_once(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://127.0.0.1:1", "unit")
    effects: list[str] = []
    flaky_attempts = [0]

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        effects.append(f"add {a} {b}")
        return a + b

    @function_tool
    def flaky() -> str:
        """Works on the third try."""
        flaky_attempts[0] += 1
        effects.append(f"flaky#{flaky_attempts[0]}")
        if flaky_attempts[0] < 3:
            raise ConnectionError("try again")
        return "ok"

    def script(turn: int, items: list[Any]) -> list[Any]:
        if turn == 0:
            return [
                call("add", "c1", a=1, b=2),
                bad_call("add", "c2", '{"a": "one"'),
                call("flaky", "c3"),
                call("add", "c4", a=3, b=4),
            ]
        seen = outputs(items)
        return [say(f"{seen['c1']} {seen['c3']} {seen['c4']} bad={'c2' in seen}")]

    model = ScriptedModel(script)
    agent = Agent(name="helper", model=model, tools=[add, flaky])
    runner = DurableRunner(app, agents=[agent], tool_policies={"flaky": ToolPolicy(max_attempts=3)})

    @app.task(name="agent.helper")
    async def run_helper(ctx: TaskContext[str], prompt: str) -> str:
        return str((await runner.run(agent, prompt)).final_output)

    run = await drive(FakeStore(app), run_helper, "go")
    assert run.result == "3 ok 7 bad=True"
    assert len(model.turns) == 2  # the replay read turn 0 from the journal
    assert sorted(effects) == ["add 1 2", "add 3 4", "flaky#1", "flaky#2", "flaky#3"]
    assert [label.split(":")[1:3] for label in run.started] == [
        ["add", "c1"],
        ["add", "c2"],
        ["flaky", "c3"],
        ["add", "c4"],
    ]


async def test_a_tool_needing_approval_waits_for_its_signal(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://127.0.0.1:1", "unit")
    refunds: list[int] = []

    @function_tool(needs_approval=True)
    def refund(amount: int) -> str:
        """Refund an order."""
        refunds.append(amount)
        return f"refunded {amount}"

    def script(turn: int, items: list[Any]) -> list[Any]:
        if turn == 0:
            return [call("refund", "r1", amount=30)]
        return [say(outputs(items).get("r1", "nothing"))]

    model = ScriptedModel(script)
    agent = Agent(name="support", model=model, tools=[refund])
    runner = DurableRunner(app, agents=[agent])

    @app.task(name="agent.support")
    async def run_support(ctx: TaskContext[str], prompt: str) -> str:
        return str((await runner.run(agent, prompt)).final_output)

    store = FakeStore(app)
    waiting = await drive(store, run_support, "refund order 7")
    [wait] = waiting.waiting_for
    assert (wait.name, wait.kind) == ("approval:r1", "approval")
    assert refunds == []

    done = await drive(store, run_support, "refund order 7", resume=True, signals={"approval:r1": {"approved": True}})
    assert done.result == "refunded 30"
    assert refunds == [30]
    assert len(model.turns) == 2
