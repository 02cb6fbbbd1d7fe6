"""An App configured from DT_* environment variables for the dashboard's tests: a task that
succeeds, one that fails with a message, and one that naps (to be caught running)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from durable_tasks import App, TaskContext

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


@app.task(name="web.nap", queue="web")
def nap(ctx: TaskContext[Nap], p: Nap) -> str:
    time.sleep(p.seconds)
    return f"slept {p.seconds}"
