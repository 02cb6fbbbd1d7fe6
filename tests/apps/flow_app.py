"""An App with flow-control limits, configured from DT_* variables, for the limits CLI tests."""

from __future__ import annotations

from durable_tasks import App, TaskContext

app = App()
openai = app.limit("openai", rate="3000/m", burst=10)


@app.task(name="flow.call", queue="agent", rate_limit=openai, concurrency_limit=2)
def call(ctx: TaskContext[str], prompt: str) -> str:
    return prompt
