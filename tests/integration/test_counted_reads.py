"""A worker reading several queues or partitions takes no more entries than it has slots for:
XREADGROUP's COUNT bounds each stream, not the read (durable_tasks/transport/reads.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest

from durable_tasks import App, TaskContext
from durable_tasks.transport.keys import partition_for
from tests.helpers import submit_all

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)]


def two_queue_app(make_app: Callable[..., App], **overrides: object) -> App:
    app = make_app(**overrides)

    @app.task(name="a", queue="qa")
    def a(ctx: TaskContext[int], n: int) -> None:
        return None

    @app.task(name="b", queue="qb")
    def b(ctx: TaskContext[int], n: int) -> None:
        return None

    return app


async def dispatch_all(app: App) -> None:
    while await app.dispatch_once():
        pass


async def test_a_read_of_two_backlogged_queues_takes_what_it_asks_shared_between_them(
    make_app: Callable[..., App],
) -> None:
    app = two_queue_app(make_app)
    submit_all(app, "a", range(10))
    submit_all(app, "b", range(10))
    await dispatch_all(app)
    read = await app.runtime.transport().read(["qa", "qb"], "c1", count=4, block=timedelta(seconds=1))
    assert sorted(entry.queue for entry in read) == ["qa", "qa", "qb", "qb"]
    await app.aclose()


async def test_a_read_woken_by_entries_on_two_queues_takes_no_more_than_asked(make_app: Callable[..., App]) -> None:
    app = two_queue_app(make_app, publish_on_commit=False)
    transport = app.runtime.transport()
    await transport.read(["qa", "qb"], "c1", count=1, block=timedelta(milliseconds=1))  # the groups exist
    submit_all(app, "a", [1])
    submit_all(app, "b", [1])
    read: list[object] = []

    async def blocked_read() -> None:
        read.extend(await transport.read(["qa", "qb"], "c1", count=1, block=timedelta(seconds=60)))

    with anyio.fail_after(30):  # a missed wake-up would wait out the block's 60 s
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked_read)
            await anyio.wait_all_tasks_blocked()
            await dispatch_all(app)  # one pass publishes to both queues at once
    assert len(read) == 1
    await app.aclose()


async def test_a_partitioned_queue_is_read_a_count_at_a_time(make_app: Callable[..., App]) -> None:
    app = make_app(queue_partitions={"jobs": 2})

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[int], n: int) -> None:
        return None

    for partition in (0, 1):
        key = next(k for k in (f"k{i}" for i in range(100)) if partition_for(k, 2) == partition)
        submit_all(app, job, range(5), partition_key=key)
    await dispatch_all(app)
    read = await app.runtime.transport().read(["jobs"], "c1", count=3, block=timedelta(seconds=1))
    assert len(read) == 3
    await app.aclose()


async def test_a_worker_of_two_queues_runs_no_more_attempts_than_its_concurrency(
    make_app: Callable[..., App],
) -> None:
    app = make_app(concurrency=1)  # one sandbox: a read of one entry, from whichever queue
    running, most = 0, 0

    async def hold(ctx: TaskContext[int], n: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.sleep(0.01)  # the work: a slot held while other reads happen
        running -= 1

    app.task(name="a", queue="qa")(hold)
    app.task(name="b", queue="qb")(hold)
    submit_all(app, "a", range(20))
    submit_all(app, "b", range(20))
    await dispatch_all(app)
    assert await app.work(max_tasks=40, timeout=timedelta(seconds=60)) == 40
    assert most == 1
    await app.aclose()
