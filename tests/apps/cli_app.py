"""An App configured only from DT_* environment variables, for CLI and process tests."""

from __future__ import annotations

import time

from pydantic import BaseModel

from durable_tasks import App, TaskContext

app = App()


class Nap(BaseModel):
    seconds: float = 0.0


@app.task(name="cli.nap", queue="cli")
def nap(ctx: TaskContext[Nap], p: Nap) -> str:
    time.sleep(p.seconds)
    return f"slept {p.seconds}"


@app.task(name="cli.fail", queue="cli", max_attempts=1)
def fail(ctx: TaskContext[Nap], p: Nap) -> str:
    raise ValueError(f"cannot nap {p.seconds} s")
