"""Model call ids are no keys: a model may reuse one in a later turn (pydantic-ai's TestModel
does, every turn), and each request for approval under it is still its own question."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durable_tasks import App, Task, TaskContext, TaskState
from tests.helpers import run_until_quiet, submit

pytestmark = pytest.mark.anyio

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")


def refunds_twice_under_one_call_id(app: App, refunds: list[int]) -> Task[str, str]:
    """A pydantic-ai run whose model asks for refund(30), then refund(5000), both as call ``r1``,
    then answers with what the tool calls returned."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from durable_tasks.integrations.pydantic_ai import DurableTasksDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if len(returns) < 2:
            amount = 5000 if returns else 30
            return ModelResponse(parts=[ToolCallPart("refund", {"amount": amount}, tool_call_id="r1")])
        return ModelResponse(parts=[TextPart("; ".join(str(p.content) for p in returns))])

    agent: Agent[None, str] = Agent(FunctionModel(model), name="reused_ids", capabilities=[DurableTasksDurability(app)])

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        """Refund an order."""
        refunds.append(amount)
        return f"refunded {amount}"

    @app.task(name="reused_ids.run", queue="agents")
    async def run(ctx: TaskContext[str], question: str) -> str:
        return (await agent.run(question)).output

    return run


def open_approvals(app: App) -> list[tuple[str, str, Any]]:
    return [(a.task_id, a.name, a.request["args"]) for a in app.open_approvals()]


async def test_a_later_call_reusing_a_call_id_waits_for_its_own_approval(make_app: Callable[..., App]) -> None:
    app = make_app()
    refunds: list[int] = []
    run_task = refunds_twice_under_one_call_id(app, refunds)
    app.create_all()
    run_id = submit(app, run_task, "refund order 7")
    await run_until_quiet(app)
    assert open_approvals(app) == [(run_id, "approval:r1", {"amount": 30})]

    assert app.approve(run_id, "approval:r1", by="ops")  # approves refund(30), and only that
    await run_until_quiet(app)
    assert refunds == [30]  # refund(5000) was never shown to anyone: it waits for its own answer
    assert app.get_task(run_id).state == TaskState.WAITING
    assert open_approvals(app) == [(run_id, "approval:r1#1", {"amount": 5000})]

    assert app.approve(run_id, "approval:r1#1", approved=False, reason="over the limit", by="ops")
    await run_until_quiet(app)
    done = app.get_task(run_id)
    assert (done.state, done.result) == (TaskState.SUCCEEDED, "refunded 30; over the limit")
    assert refunds == [30]
    assert open_approvals(app) == []
