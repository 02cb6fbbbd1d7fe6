"""An App configured from DT_* environment variables for the dashboard's tests: a task that
succeeds, one that fails with a message, one that naps (to be caught running), and an agent
with a scripted model and one tool."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from durable_tasks import App, TaskContext, current_journal
from durable_tasks.agents import Agent, ModelTurn, ScriptedModel, ToolCall
from durable_tasks.journal import StepKind

app = App()


class Nap(BaseModel):
    seconds: float = 0.0


class Echo(BaseModel):
    text: str


@app.task(name="web.echo", queue="web")
def echo(ctx: TaskContext[Echo], p: Echo) -> dict[str, Any]:
    return {"echo": p.text}


@app.task(name="web.explode", queue="web", max_attempts=2)
def explode(ctx: TaskContext[Echo], p: Echo) -> None:
    raise ValueError(f"cannot digest {p.text}")


@app.task(name="web.refund", queue="web")
async def refund(ctx: TaskContext[Echo], p: Echo) -> dict[str, Any]:
    """A run that waits for a person's approval (a suspended task: no worker slot)."""
    journal = current_journal()
    assert journal is not None
    answer = await journal.wait_signal("approval:refund", kind=StepKind.APPROVAL, request={"refund": p.text})
    return {"refund": p.text, "answer": answer}


@app.task(name="web.nap", queue="web")
def nap(ctx: TaskContext[Nap], p: Nap) -> str:
    time.sleep(p.seconds)
    return f"slept {p.seconds}"


class City(BaseModel):
    city: str


def weather_script(messages: list[dict[str, Any]]) -> ModelTurn:
    """Turn 0 asks for the weather in two cities; turn 1 answers from the tool results."""
    if not any(m["role"] == "assistant" for m in messages):
        calls = [ToolCall(id=f"call_{c}", name="weather", arguments={"city": c}) for c in ("Oslo", "Lima")]
        return ModelTurn(content="Let me look both up.", tool_calls=calls)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    return ModelTurn(content=f"Forecasts: {', '.join(results)}")


forecaster = Agent(app, "forecaster", ScriptedModel(weather_script), queue="web-agent")


@forecaster.tool(description="The forecast for a city")
def weather(ctx: TaskContext[Any], args: City) -> str:
    return f"{args.city}: sunny"
