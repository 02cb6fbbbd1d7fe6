"""The runtime on uvloop: the loop uvicorn runs an application on when uvloop is installed,
and one a user's tests may start many times in one process (each new loop finds the Redis
connections of the one before, which only the socket can close)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
from pydantic import BaseModel

from durable_tasks import App, TaskContext
from tests.helpers import submit

pytest.importorskip("uvloop", reason="uvloop is a dev dependency: pip install -e '.[dev]'")


class Job(BaseModel):
    n: int


def test_a_worker_runs_on_uvloop_in_one_event_loop_after_another(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="double", queue="jobs")
    def double(ctx: TaskContext[Job], p: Job) -> int:
        return p.n * 2

    async def dispatch_and_work() -> int:
        await app.dispatch_once()
        return await app.work(max_tasks=1, timeout=timedelta(seconds=10))

    for n in (1, 2, 3):  # the second and third loops close the connections of the one before
        task_id = submit(app, "double", {"n": n})
        assert anyio.run(dispatch_and_work, backend="asyncio", backend_options={"use_uvloop": True}) == 1
        assert app.get_task(task_id).result == n * 2
