"""An App with periodic schedules, configured from DT_* variables, for the scheduler's CLI tests."""

from __future__ import annotations

from datetime import datetime, timedelta

from durable_tasks import App, TaskContext

app = App()


@app.periodic(every=timedelta(seconds=1), name="every-second")
@app.task(name="periodic.tick", queue="periodic")
def tick(ctx: TaskContext[datetime], at: datetime) -> str:
    return at.isoformat()


@app.periodic("30 2 * * *", timezone="Europe/Paris", name="nightly")
@app.task(name="periodic.nightly", queue="periodic")
def nightly(ctx: TaskContext[datetime], at: datetime) -> None:
    return None
