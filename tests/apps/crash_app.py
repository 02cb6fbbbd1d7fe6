"""An app for the worker-crash test: a task that announces it started, then holds on.

The child process builds it from ``DT_*`` environment variables and works forever::

    python -c "import anyio; from tests.apps.crash_app import build_app; anyio.run(build_app().work)"

``CRASH_APP_HOLD_SECONDS`` (default 30) is how long the handler sleeps after writing its
marker file, so the test can SIGKILL the process mid-task. The test process registers the same
task on its own App with ``hold_seconds=0`` to finish the job.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import anyio
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.orm import Session
from sqlmodel import Field, SQLModel

from durable_tasks import App, Task, TaskContext

__all__ = [
    "TASK_NAME",
    "CrashJob",
    "CrashVerdict",
    "build_app",
    "crash_verdicts_table",
    "create_business_tables",
    "register",
]

TASK_NAME = "crash.judge"
QUEUE = "crash"


class CrashVerdict(SQLModel, table=True):
    """The business row the on-commit hook writes: one per task, if the fence works."""

    __tablename__ = "crash_verdicts"

    id: int | None = Field(default=None, primary_key=True)
    task_id: str = Field(max_length=36, index=True)
    verdict: str = Field(max_length=200)
    written_by_pid: int
    attempt: int


crash_verdicts_table: sa.Table = CrashVerdict.__table__  # type: ignore[attr-defined]


class CrashJob(BaseModel):
    """Where the handler drops its "I started" marker files."""

    marker_dir: str


def create_business_tables(engine: sa.Engine) -> None:
    """Create ``crash_verdicts`` (explicitly, like the runtime's own tables)."""
    SQLModel.metadata.create_all(engine, tables=[crash_verdicts_table])


def register(app: App, *, hold_seconds: float) -> Task[CrashJob, Any]:
    """Register the crash task and its on-commit hook on ``app``."""

    @app.task(name=TASK_NAME, queue=QUEUE, max_attempts=1)
    async def judge(ctx: TaskContext[CrashJob], job: CrashJob) -> str:
        marker = anyio.Path(job.marker_dir) / f"attempt-{ctx.attempt}-pid-{os.getpid()}"
        await marker.write_text(f"{socket.gethostname()} {os.getpid()} {ctx.attempt}\n")
        await anyio.sleep(hold_seconds)
        return f"accepted (attempt {ctx.attempt})"

    @judge.on_commit
    def write_verdict(session: Session, ctx: TaskContext[Any], result: Any) -> None:
        session.add(
            CrashVerdict(task_id=ctx.task_id, verdict=str(result), written_by_pid=os.getpid(), attempt=ctx.attempt)
        )

    return judge


def build_app() -> App:
    """The child's App: every setting from ``DT_*`` environment variables."""
    app = App()
    register(app, hold_seconds=float(os.environ.get("CRASH_APP_HOLD_SECONDS", "30")))
    return app
