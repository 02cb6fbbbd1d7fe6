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

from durable_tasks import App, TaskContext, TaskState, current_task
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


@pytest.mark.parametrize("kind", ["async", "sync", "async, raising", "sync, raising"])
async def test_attempts_leave_no_reference_cycles(
    sqlite_app: App, kind: str, collector_saving_garbage: list[object]
) -> None:
    """Also when the handler raises: a sync handler's exception crosses the thread's hand-off,
    whose wait held the call's future (and so the exception, whose traceback holds that wait):
    each failed attempt left its context in a cycle until a collection. And at the worker's
    stop: the lease keeper's loop held its last heartbeat's attempts while it slept, so the
    cancellation's traceback kept them (this one showed only now and then)."""
    app = sqlite_app
    raising = kind.endswith("raising")

    def outcome(ctx: TaskContext[int], n: int) -> int:
        assert current_task() is ctx
        if raising:
            raise TimeoutError("the tool timed out")
        return n

    if kind.startswith("async"):

        @app.task(name="job", queue="jobs", max_attempts=1)
        async def job(ctx: TaskContext[int], n: int) -> int:
            return outcome(ctx, n)

    else:

        @app.task(name="job", queue="jobs", max_attempts=1)
        def job(ctx: TaskContext[int], n: int) -> int:
            return outcome(ctx, n)

    handles = submit_all(app, "job", range(30))
    while await app.dispatch_once():
        pass
    assert await app.work(max_tasks=30, timeout=timedelta(seconds=30)) == 30
    assert {app.get_task(h.id).state for h in handles} == {TaskState.FAILED if raising else TaskState.SUCCEEDED}
    gc.collect()
    # This test's attempts only: another test's objects in this process may turn to garbage now.
    mine = {h.id for h in handles}
    left = [o for o in collector_saving_garbage if isinstance(o, TaskContext | StoreJournal) and _task_id(o) in mine]
    assert left == []
    assert current_task() is None


def _task_id(o: TaskContext[object] | StoreJournal) -> str:
    return o.claim.task_id if isinstance(o, StoreJournal) else o.task_id
