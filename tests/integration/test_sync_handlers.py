"""Sync handlers on the worker's own threads: timeouts, cancellation, handlers side by side."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest

from durable_tasks import App, TaskContext, TaskState, current_task
from durable_tasks.worker import Worker
from tests.helpers import submit, submit_all

pytestmark = pytest.mark.anyio

WAIT_S = 10.0  # bound on waiting for a condition; never reached when the code is right


async def test_a_sync_handler_past_its_timeout_fails_at_once_and_is_told_to_stop(app: App) -> None:
    told_to_stop = threading.Event()

    @app.task(name="slow", queue="jobs", max_attempts=1, timeout=timedelta(milliseconds=200))
    def slow(ctx: TaskContext[int], n: int) -> int:
        if ctx.cancelled.wait(WAIT_S):  # set by the timeout while this thread still runs
            told_to_stop.set()
        return n

    task_id = submit(app, slow, 1)
    await app.dispatch_once()
    with anyio.fail_after(WAIT_S / 2):  # the attempt ends at its timeout, not when the thread does
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=WAIT_S)) == 1
    info = app.get_task(task_id)
    assert (info.state, info.error_type, info.result) == (TaskState.FAILED, "TimeoutError", None)
    assert await anyio.to_thread.run_sync(told_to_stop.wait, WAIT_S)


async def test_sync_handlers_that_wait_for_each_other_all_run_at_once(app: App) -> None:
    arrived = threading.Barrier(4, timeout=WAIT_S)  # breaks (and the tasks fail) unless all 4 run together

    @app.task(name="meet", queue="jobs", max_attempts=1)
    def meet(ctx: TaskContext[int], n: int) -> int:
        arrived.wait()
        return n

    ids = [h.id for h in submit_all(app, meet, [1, 2, 3, 4])]
    await app.dispatch_once()
    worker = Worker(app.runtime, concurrency=4)
    assert await worker.run(max_tasks=4, timeout=timedelta(seconds=WAIT_S * 2)) == 4
    assert [app.get_task(i).result for i in ids] == [1, 2, 3, 4]


async def test_a_sync_handler_sees_its_own_task_as_the_current_one(app: App) -> None:
    @app.task(name="whoami", queue="jobs")
    def whoami(ctx: TaskContext[int], n: int) -> str:
        found = current_task()
        return found.task_id if found else "none"

    task_id = submit(app, whoami, 1)
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=WAIT_S)) == 1
    assert app.get_task(task_id).result == task_id


async def test_a_sync_task_waiting_for_a_handler_thread_spends_its_timeout_and_never_starts(
    make_app: Callable[..., App],
) -> None:
    """With DT_HANDLER_THREADS below the concurrency, a sync task beyond the threads waits for
    one, holding its slot and lease; that wait counts against its timeout, and a task whose
    timeout passes while it waits fails without its handler ever starting."""
    app = make_app(handler_threads=1)
    release = threading.Event()
    started: list[str] = []

    @app.task(name="hold", queue="jobs", max_attempts=1)
    def hold(ctx: TaskContext[int], n: int) -> int:
        started.append("hold")
        release.wait(WAIT_S)
        return n

    @app.task(name="brief", queue="jobs", max_attempts=1, timeout=timedelta(milliseconds=300))
    def brief(ctx: TaskContext[int], n: int) -> int:
        started.append("brief")
        return n

    held = submit(app, hold, 1)
    await app.dispatch_once()
    worker = Worker(app.runtime, concurrency=2)
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            assert await worker.run(max_tasks=2, timeout=timedelta(seconds=WAIT_S * 2)) == 2

        tg.start_soon(run)
        with anyio.fail_after(WAIT_S):
            while started != ["hold"]:  # the one thread is taken
                await anyio.sleep(0.01)
        waiting = submit(app, brief, 2)
        await app.dispatch_once()
        with anyio.fail_after(WAIT_S):
            while app.get_task(waiting).state != TaskState.FAILED:
                await anyio.sleep(0.01)
        release.set()
    assert started == ["hold"]  # brief never ran
    assert app.get_task(waiting).error_type == "TimeoutError"
    assert app.get_task(held).result == 1
