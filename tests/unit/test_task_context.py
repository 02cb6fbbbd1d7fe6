"""TaskContext.cancelled: made on first use, one event whichever thread looks first."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from durable_tasks.handler_threads import HandlerThreads
from durable_tasks.tasks import Task, TaskContext

pytestmark = pytest.mark.anyio


def context() -> TaskContext[int]:
    return TaskContext(
        task_id="t1", name="demo", queue="jobs", generation=0, attempt=1, delivery=0, idempotency_key=None, payload=7
    )


def task(fn: Any) -> Task[int, Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not submitted in these tests")

    return Task(
        fn,
        submit=refuse,
        submit_many=refuse,
        name="demo",
        queue="jobs",
        max_attempts=1,
        timeout=timedelta(seconds=10),
        retry_on=(),
    )


async def test_a_sync_attempt_that_never_looks_makes_no_cancelled_event() -> None:
    """An Event (a Condition and its locks) per attempt is a visible share of a short sync
    task's cost: it is made only when the handler, a timeout or a fence asks for it."""
    made_before_running: list[bool] = []

    def handler(ctx: TaskContext[int], n: int) -> int:
        made_before_running.append(ctx._cancelled is not None)
        return n + 1

    threads = HandlerThreads(2)
    ctx = context()
    try:
        assert await task(handler).run(ctx, limiter=threads) == 8
    finally:
        threads.close()
    assert made_before_running == [False]
    assert ctx._cancelled is None


def test_threads_that_look_first_at_once_share_one_event() -> None:
    """The handler's thread and the loop (a timeout) may both ask first: the one made is the
    one both see, so a cancellation set by either reaches the other."""
    for _ in range(50):
        ctx = context()
        start = threading.Barrier(8)
        seen: list[threading.Event] = []

        def look(
            ctx: TaskContext[int] = ctx, start: threading.Barrier = start, seen: list[threading.Event] = seen
        ) -> None:
            start.wait(10)
            seen.append(ctx.cancelled)

        threads = [threading.Thread(target=look) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(seen) == 8
        assert all(event is seen[0] for event in seen)
        ctx.cancelled.set()
        assert seen[0].is_set()
