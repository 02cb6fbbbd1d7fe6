from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState

pytestmark = pytest.mark.anyio


class Add(BaseModel):
    a: int
    b: int


async def test_submit_dispatch_work_succeeds(app: App) -> None:
    @app.task(name="add", queue="math")
    def add(ctx: TaskContext[Add], p: Add) -> int:
        return p.a + p.b

    with Session(app.engine) as s:
        h = add.submit(s, Add(a=1, b=2), idempotency_key="k1")
        s.commit()
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = app.get_task(h.id)
    assert info.state == TaskState.SUCCEEDED
    assert info.result == 3
    assert [a.outcome for a in info.attempts] == ["succeeded"]
