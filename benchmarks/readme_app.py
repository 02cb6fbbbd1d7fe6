"""The README's task, as a user writes it: a plain ``def`` handler, a pydantic payload, a dict
result, no settings. ``bench_dt readme`` runs it in ``durable-tasks worker
benchmarks.readme_app:app``, whose App is built from DT_BENCH_DB / DT_BENCH_REDIS / DT_BENCH_NS
when the CLI first asks for it."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from durable_tasks import App, TaskContext

TASK = "judge.run"


class JudgeRequest(BaseModel):
    submission_id: int
    code: str


def register(app: App) -> None:
    """The README's task on ``app``."""

    @app.task(name=TASK, queue="judge", max_attempts=5)
    def judge(ctx: TaskContext[JudgeRequest], req: JudgeRequest) -> dict[str, str]:
        return {"verdict": "AC"}


def request(i: int) -> JudgeRequest:
    """The payload of the README path's i-th task."""
    return JudgeRequest(submission_id=i, code="print(42)\n" * 4)


def build(database_url: str, redis_url: str, namespace: str) -> App:
    """An App at every default setting, with the README's task."""
    app = App(database_url=database_url, redis_url=redis_url, namespace=namespace)
    register(app)
    return app


_apps: dict[str, App] = {}


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(name)
    if "app" not in _apps:
        _apps["app"] = build(os.environ["DT_BENCH_DB"], os.environ["DT_BENCH_REDIS"], os.environ["DT_BENCH_NS"])
    return _apps["app"]
