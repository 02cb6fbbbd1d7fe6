"""On a database without notifications (SQLite, MySQL), the runtime's own outbox writes wake the
dispatchers through Redis when they commit, as a submit does: a suspension's children and the
resume of a parent whose last child settled do not wait for the dispatcher's poll."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
from sqlmodel import Session

from durable_tasks import App, TaskContext, current_journal

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite", "mysql"], indirect=True)]

#: Far longer than the deadline below: only a wake-up can explain a run finished sooner.
POLL = timedelta(seconds=120)


async def test_a_parent_waiting_on_children_is_resumed_without_a_poll(make_app: Callable[..., App]) -> None:
    app = make_app(poll_interval=POLL)

    @app.task(name="double", queue="jobs")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    @app.task(name="parent", queue="jobs")
    async def parent(ctx: TaskContext[int], n: int) -> int:
        journal = current_journal()
        assert journal is not None
        first = await journal.child(double, n)  # suspends; resumed when it commits
        return int(await journal.child(double, first)) + 1

    with Session(app.engine) as session:
        handle = parent.submit(session, 5)
        session.commit()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(reaper=False, stop=stop))
        # Two suspensions, two resumes and three children: five hops a poll would take 120 s each.
        with anyio.fail_after(60):
            assert await handle.wait() == 21
        stop.set()
    assert [s.kind for s in app.steps(handle.id)] == ["child", "child"]
    await app.aclose()
