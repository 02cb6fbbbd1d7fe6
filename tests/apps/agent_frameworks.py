"""One script, two frameworks: a pydantic-ai agent and an OpenAI Agents SDK agent with the same
model script and the same tools, for the integration and kill-and-resume tests.

The model (pydantic-ai's ``FunctionModel``, a scripted ``agents.Model``) answers in three turns:
turn 0 calls ``add``, ``lookup`` and ``flaky`` in parallel plus ``add`` with an invalid argument;
turn 1 calls ``report`` over the results; turn 2 answers. Every model call that returns appends
``{"framework", "turn"}`` to ``AGENT_CALL_LOG``; every tool side effect is a row of
``agent_effects`` keyed by the tool task's idempotency token, so a re-run tool body cannot
write it twice. ``flaky`` fails on its first two attempts.

Kill switches for a worker process (``AGENT_KILL``, one per process): ``model`` (inside the first
model call), ``tool`` (inside ``add``, before its side effect); the runtime's failpoints cover
the others (``DT_FAILPOINTS``, which :func:`main` arms).

A subprocess builds it from ``DT_*`` variables: ``python -m tests.apps.agent_frameworks``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel

from durable_tasks import App, Task, TaskContext, current_task, failpoints
from durable_tasks.integrations import ToolPolicy

__all__ = ["ANSWER", "QUESTION", "Effect", "build", "effects_table"]

QUESTION = "What is 1 + 2, the capital of France, and what do people say about durable agents?"
ANSWER = "1 + 2 = 3; capital: Paris; search: durable agents survive crashes; REPORT(3)"
KILL_ENV = "AGENT_KILL"
CALL_LOG_ENV = "AGENT_CALL_LOG"
POLICIES = {
    "flaky": ToolPolicy(max_attempts=3, retry_on=(ConnectionError,)),
    "add": ToolPolicy(max_attempts=3, retry_on=(OSError,)),
}


class Effect(SQLModel, table=True):
    """A tool's side effect: one row per tool task, however often its body ran."""

    __tablename__ = "agent_effects"

    key: str = Field(primary_key=True, max_length=100)
    namespace: str = Field(max_length=64)
    framework: str = Field(max_length=20)
    tool: str = Field(max_length=50)
    value: str = Field(max_length=200)


effects_table: sa.Table = Effect.__table__  # type: ignore[attr-defined]


def _effect(app: App, framework: str, tool: str, value: str) -> None:
    task = current_task()
    assert task is not None, "tools run inside their tool task"
    with Session(app.engine) as session:
        effect = Effect(
            key=task.idempotency_token, namespace=app.settings.namespace, framework=framework, tool=tool, value=value
        )
        session.add(effect)
        try:
            session.commit()
        except IntegrityError:  # a re-run body: the effect is committed already
            session.rollback()


def _log_call(framework: str, turn: int) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if path:
        with Path(path).open("a", encoding="utf-8") as log:
            log.write(json.dumps({"framework": framework, "turn": turn}) + "\n")


def _kill_if(point: str) -> None:
    if os.environ.get(KILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


# -- the tools, shared ------------------------------------------------------------------------


def add_impl(app: App, framework: str, a: int, b: int) -> int:
    _kill_if("tool")
    _effect(app, framework, "add", str(a + b))
    return a + b


def lookup_impl(app: App, framework: str, key: str) -> str:
    value = {"capital:fr": "Paris"}.get(key, "unknown")
    _effect(app, framework, "lookup", value)
    return value


def flaky_impl(app: App, framework: str, query: str) -> str:
    task = current_task()
    assert task is not None
    if task.attempt <= 2:  # the attempt number comes from the database: it holds across processes
        raise ConnectionError(f"search backend unreachable (attempt {task.attempt})")
    _effect(app, framework, "flaky", query)
    return f"{query} survive crashes"


def report_impl(app: App, framework: str, findings: list[str]) -> str:
    value = f"REPORT({len(findings)})"
    _effect(app, framework, "report", value)
    return value


def final_answer(results: dict[str, str]) -> str:
    return f"1 + 2 = {results['c1']}; capital: {results['c2']}; search: {results['c3']}; {results['c5']}"


# -- pydantic-ai ----------------------------------------------------------------------------------


def _pydantic_ai(app: App) -> Task[str, str]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from durable_tasks.integrations.pydantic_ai import DurableTasksDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _kill_if("model")
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        returns = {
            p.tool_call_id: str(p.content)
            for m in messages
            for p in getattr(m, "parts", [])
            if isinstance(p, ToolReturnPart)
        }
        if turn == 0:
            parts: list[Any] = [
                ToolCallPart("add", {"a": 1, "b": 2}, tool_call_id="c1"),
                ToolCallPart("lookup", {"key": "capital:fr"}, tool_call_id="c2"),
                ToolCallPart("flaky", {"query": "durable agents"}, tool_call_id="c3"),
                ToolCallPart("add", {"a": "one", "b": 2}, tool_call_id="c4"),
            ]
        elif turn == 1:
            parts = [ToolCallPart("report", {"findings": [returns["c1"], returns["c2"], returns["c3"]]}, "c5")]
        else:
            parts = [TextPart(final_answer(returns))]
        _log_call("pydantic_ai", turn)
        return ModelResponse(parts=parts)

    durability = DurableTasksDurability(app, queue="agents", tool_policies=POLICIES)
    agent: Agent[None, str] = Agent(FunctionModel(model), name="pai", capabilities=[durability])

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return add_impl(app, "pydantic_ai", a, b)

    @agent.tool_plain
    def lookup(key: str) -> str:
        """Look a fact up."""
        return lookup_impl(app, "pydantic_ai", key)

    @agent.tool_plain
    def flaky(query: str) -> str:
        """Search (flaky)."""
        return flaky_impl(app, "pydantic_ai", query)

    @agent.tool_plain
    def report(findings: list[str]) -> str:
        """Write a report."""
        return report_impl(app, "pydantic_ai", findings)

    @app.task(name="agent.pydantic_ai", queue="agents", max_attempts=3)
    async def run_pai(ctx: TaskContext[str], question: str) -> str:
        return (await agent.run(question)).output

    return run_pai


# -- the OpenAI Agents SDK -----------------------------------------------------------------------


def _openai_agents(app: App) -> Task[str, str]:
    from agents import Agent, ModelResponse, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from durable_tasks.integrations.openai_agents import DurableRunner

    set_tracing_disabled(True)

    def fcall(name: str, call_id: str, arguments: str) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=arguments)

    class Scripted(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            _kill_if("model")
            items = input if isinstance(input, list) else []
            returns = {
                str(i["call_id"]): str(i["output"])
                for i in items
                if isinstance(i, dict) and i.get("type") == "function_call_output"
            }
            turn = 0 if not returns else (1 if "c5" not in returns else 2)
            if turn == 0:
                output: list[Any] = [
                    fcall("add", "c1", '{"a": 1, "b": 2}'),
                    fcall("lookup", "c2", '{"key": "capital:fr"}'),
                    fcall("flaky", "c3", '{"query": "durable agents"}'),
                    fcall("add", "c4", '{"a": "one", "b": 2}'),
                ]
            elif turn == 1:
                findings = json.dumps({"findings": [returns["c1"], returns["c2"], returns["c3"]]})
                output = [fcall("report", "c5", findings)]
            else:
                text = ResponseOutputText(type="output_text", text=final_answer(returns), annotations=[])
                output = [
                    ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[text])
                ]
            _log_call("openai_agents", turn)
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return add_impl(app, "openai_agents", a, b)

    @function_tool
    def lookup(key: str) -> str:
        """Look a fact up."""
        return lookup_impl(app, "openai_agents", key)

    @function_tool
    def flaky(query: str) -> str:
        """Search (flaky)."""
        return flaky_impl(app, "openai_agents", query)

    @function_tool
    def report(findings: list[str]) -> str:
        """Write a report."""
        return report_impl(app, "openai_agents", findings)

    agent = Agent(name="oai", model=Scripted(), tools=[add, lookup, flaky, report])
    runner = DurableRunner(app, queue="agents", tool_policies=POLICIES, agents=[agent])

    @app.task(name="agent.openai_agents", queue="agents", max_attempts=3)
    async def run_oai(ctx: TaskContext[str], question: str) -> str:
        return str((await runner.run(agent, question)).final_output)

    return run_oai


FRAMEWORK_ENV = "AGENT_FRAMEWORK"


def build(frameworks: str = "pydantic_ai,openai_agents", **settings: Any) -> tuple[App, dict[str, Task[str, str]]]:
    """The App (``DT_*`` variables fill in what ``settings`` does not give) and the run task of
    each framework named, by framework name."""
    app = App(tables=[Effect], **settings)
    builders = {"pydantic_ai": _pydantic_ai, "openai_agents": _openai_agents}
    return app, {name: builders[name](app) for name in frameworks.split(",")}


def main() -> None:
    """Run a dispatcher, a worker and a reaper until killed (only ``AGENT_FRAMEWORK``'s agent:
    importing a framework takes seconds)."""
    failpoints.enable_from_environment()  # the kill-and-resume test arms them with DT_FAILPOINTS
    app, _ = build(os.environ.get(FRAMEWORK_ENV, "pydantic_ai,openai_agents"))
    anyio.run(app.run)


if __name__ == "__main__":
    main()
