"""An attempt leaves no reference cycle behind: when it ends, reference counting frees its
asyncio task, context and links at once, instead of the garbage collector finding them later
(a cycle per attempt kept each alive until a collection: memory that grew with the tasks run,
and collections that walked them). The attempt's context variables (current_task(),
current_journal()) are scoped to its run, where they held the attempt that held its task."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import timedelta

import pytest

from durable_tasks import App, TaskContext, current_task
from durable_tasks.journaled import StoreJournal
from tests.helpers import submit_all

pytestmark = pytest.mark.anyio


@pytest.fixture
def collector_saving_garbage() -> Iterator[list[object]]:
    """The collector off, and what a collection then finds unreachable kept in gc.garbage."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_attempts_leave_no_reference_cycles(
    sqlite_app: App, kind: str, collector_saving_garbage: list[object]
) -> None:
    app = sqlite_app
    if kind == "async":

        @app.task(name="job", queue="jobs")
        async def job(ctx: TaskContext[int], n: int) -> int:
            assert current_task() is ctx
            return n

    else:

        @app.task(name="job", queue="jobs")
        def job(ctx: TaskContext[int], n: int) -> int:
            assert current_task() is ctx
            return n

    submit_all(app, "job", range(30))
    while await app.dispatch_once():
        pass
    assert await app.work(max_tasks=30, timeout=timedelta(seconds=30)) == 30
    gc.collect()
    left = [o for o in collector_saving_garbage if isinstance(o, TaskContext | StoreJournal)]
    assert left == []
    assert current_task() is None
