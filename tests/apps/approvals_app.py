"""An App from ``DT_*`` variables with one agent per framework whose ``refund`` tool needs
approval, for the approvals round trip (``durable-tasks approvals list tests.apps.approvals_app:app``).

Each agent's scripted model asks for ``refund(amount=30)`` (call id ``r1``) and then answers
with what the tool returned; ``REFUNDS`` counts the refunds made in this process.
"""

from __future__ import annotations

from typing import Any

from durable_tasks import App, TaskContext

__all__ = ["REFUNDS", "app", "run_tasks"]

app = App()
REFUNDS: list[str] = []


def _pydantic_ai() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from durable_tasks.integrations.pydantic_ai import DurableTasksDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("refund", {"amount": 30}, tool_call_id="r1")])
        return ModelResponse(parts=[TextPart(str(returns[0].content))])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="pai_support", capabilities=[DurableTasksDurability(app)]
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        """Refund an order."""
        REFUNDS.append(f"pydantic_ai:{amount}")
        return f"refunded {amount}"

    @app.task(name="support.pydantic_ai", queue="agents")
    async def run(ctx: TaskContext[str], question: str) -> str:
        return (await agent.run(question)).output


def _openai_agents() -> None:
    from agents import Agent, ModelResponse, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from durable_tasks.integrations.openai_agents import DurableRunner

    set_tracing_disabled(True)

    class Scripted(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            items = input if isinstance(input, list) else []
            outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
            if not outputs:
                call = ResponseFunctionToolCall(
                    type="function_call", call_id="r1", name="refund", arguments='{"amount": 30}'
                )
                return ModelResponse(output=[call], usage=Usage(), response_id=None)
            text = ResponseOutputText(type="output_text", text=str(outputs[0]["output"]), annotations=[])
            message = ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool(needs_approval=True)
    def refund(amount: int) -> str:
        """Refund an order."""
        REFUNDS.append(f"openai_agents:{amount}")
        return f"refunded {amount}"

    agent = Agent(name="oai_support", model=Scripted(), tools=[refund])
    runner = DurableRunner(app, agents=[agent])

    @app.task(name="support.openai_agents", queue="agents")
    async def run(ctx: TaskContext[str], question: str) -> str:
        return str((await runner.run(agent, question)).final_output)


_pydantic_ai()
_openai_agents()

#: The run task of each framework, by framework name.
run_tasks = {"pydantic_ai": app.registry["support.pydantic_ai"], "openai_agents": app.registry["support.openai_agents"]}
