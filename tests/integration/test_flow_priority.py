"""Priorities (durable_tasks.flow): a queue whose tasks declare a priority has one stream per
level, read highest first; a high task submitted after a backlog starts in the next read
batch; the starvation guard keeps a share of each read for lower levels; bad priorities are
typed errors that write nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, InvalidFlowControlError, TaskContext, current_journal
from durable_tasks.flow.policy import GUARD_SHARE, guard_reserve
from durable_tasks.records import tasks_table
from durable_tasks.transport.keys import partition_for
from durable_tasks.transport.levels import read_by_level
from durable_tasks.transport.streams import RedisStreamsTransport
from tests.helpers import keys, submit, submit_all

pytestmark = pytest.mark.anyio


def prioritized_app(make_app: Callable[..., App], started: list[int], **overrides: object) -> App:
    app = make_app(**overrides)

    @app.task(name="job", queue="jobs", priority=0)
    async def job(ctx: TaskContext[int], n: int) -> None:
        started.append(n)

    return app


async def dispatch_all(app: App) -> None:
    while await app.dispatch_once():
        pass


async def test_high_priority_tasks_start_in_the_next_read_batch_after_a_backlog(make_app: Callable[..., App]) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started, concurrency=20, batch_size=500)
    submit_all(app, "job", range(1000))  # level 0
    await dispatch_all(app)
    assert await app.work(max_tasks=40, timeout=timedelta(seconds=60)) == 40  # two read batches of the backlog
    high = list(range(10_000, 10_010))
    submit_all(app, "job", high, priority=3)
    await dispatch_all(app)
    assert await app.work(max_tasks=20, timeout=timedelta(seconds=60)) == 20  # the next read batch
    assert set(high) <= set(started[40:60]), started[40:60]
    await app.aclose()


async def test_high_priority_tasks_are_dispatched_ahead_of_an_outbox_backlog(make_app: Callable[..., App]) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started, concurrency=20, batch_size=50)
    submit_all(app, "job", range(1000))  # level 0, not dispatched yet
    high = list(range(10_000, 10_010))
    submit_all(app, "job", high, priority=1)
    assert await app.dispatch_once() == 50  # one pass of the backlog's size takes the high ones first
    assert await app.work(max_tasks=20, timeout=timedelta(seconds=60)) == 20
    assert set(high) <= set(started), started
    await app.aclose()


async def test_a_delayed_task_is_not_made_early_by_its_priority(make_app: Callable[..., App]) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started)
    submit(app, "job", 1, priority=3, delay=timedelta(hours=1))
    assert await app.dispatch_once() == 0
    await app.aclose()


async def test_a_prioritized_entry_travels_on_its_level_stream(make_app: Callable[..., App]) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started)
    submit(app, "job", 1, priority=2)
    submit(app, "job", 2)
    await dispatch_all(app)
    client = app.runtime.transport().client
    assert await client.xlen(keys(app).level_stream(2)) == 1
    assert await client.xlen(keys(app).stream) == 1
    with app.engine.connect() as conn:
        query = sa.select(tasks_table.c.priority).where(tasks_table.c.namespace == app.settings.namespace)
        stored = conn.execute(query).scalars().all()
    assert sorted(stored) == [0, 2]  # the task's declared level, and the submit's
    await app.work(max_tasks=2, timeout=timedelta(seconds=30))
    assert started == [1, 2]
    await app.aclose()


async def test_status_counts_the_entries_of_every_level(make_app: Callable[..., App]) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started)
    submit_all(app, "job", range(3))
    submit_all(app, "job", range(3, 5), priority=2)
    await dispatch_all(app)
    read = await app.runtime.transport().read(["jobs"], "reader", count=2, block=timedelta(milliseconds=10))
    assert {e.stream for e in read} == {keys(app).level_stream(2)}
    stats = (await app.stats())["jobs"]
    assert (stats.pel_size, stats.stream_lag) == (2, 3)  # read at level 2, waiting at level 0
    await app.aclose()


async def test_the_starvation_guard_reads_lower_levels_first_for_its_share(make_app: Callable[..., App]) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started, concurrency=GUARD_SHARE * 2, batch_size=500)
    submit_all(app, "job", range(100))  # level 0
    submit_all(app, "job", range(1000, 1100), priority=1)
    await dispatch_all(app)
    assert await app.work(max_tasks=GUARD_SHARE * 2, timeout=timedelta(seconds=60)) == GUARD_SHARE * 2
    low = [n for n in started if n < 1000]
    assert len(low) == guard_reserve(GUARD_SHARE * 2, 0) == 2
    await app.aclose()


class AsCluster:
    """The real transport, read as a cluster's: one script call per hash tag (the standalone
    server runs each call as the node holding that slot would)."""

    cluster = True

    def __init__(self, transport: RedisStreamsTransport) -> None:
        self.transport = transport
        self.level_reads = 0

    async def run_script(self, name: str, keys: list[str], args: list[str | int]) -> Any:
        return await self.transport.run_script(name, keys, args)

    async def ensure_group(self, stream: str) -> None:
        await self.transport.ensure_group(stream)


async def test_on_a_cluster_a_partitions_low_backlog_leaves_room_for_anothers_high_entry(
    make_app: Callable[..., App],
) -> None:
    # A queue's partitions have hash tags of their own: one script call each on a cluster.
    app = prioritized_app(make_app, [], queue_partitions={"jobs": 2})
    key0, key1 = (next(k for k in (f"k{i}" for i in range(100)) if partition_for(k, 2) == p) for p in (0, 1))
    submit_all(app, "job", range(20), partition_key=key0)  # a level-0 backlog in partition 0
    submit_all(app, "job", [999], partition_key=key1, priority=3)  # one high task in partition 1
    await dispatch_all(app)
    transport = app.runtime.transport()
    streams = [stream for stream, _, _ in transport.streams("jobs")]
    for stream in streams:
        await transport.ensure_group(stream)
    reply, _ = await read_by_level(AsCluster(transport), streams, "c1", 4)
    read = Counter[str]()
    for stream, entries in reply:  # a slot read again (it filled its share) may name a stream twice
        read[stream.rsplit(":", 1)[-1]] += len(entries)
    assert read == {"p3": 1, "stream": 3}  # the high entry, and the backlog fills the rest
    await app.aclose()


async def test_a_queue_without_a_declared_priority_refuses_one_at_submit(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="plain", queue="jobs")
    def plain(ctx: TaskContext[int], n: int) -> None:
        return None

    started: list[int] = []
    prioritized_app(make_app, started)  # another app: its levels are not this one's
    with Session(app.engine) as session, pytest.raises(InvalidFlowControlError, match="no priority levels"):
        app.submit(session, "plain", 1, priority=1)
    await app.aclose()


@pytest.mark.parametrize("bad", [-1, 4, True, "high"])
async def test_a_priority_out_of_range_is_a_typed_error(make_app: Callable[..., App], bad: object) -> None:
    started: list[int] = []
    app = prioritized_app(make_app, started)
    with Session(app.engine) as session, pytest.raises(InvalidFlowControlError, match="priority="):
        app.submit(session, "job", 1, priority=bad)  # type: ignore[arg-type]
    await app.aclose()


@pytest.mark.parametrize("publish_on_commit", [True, False])
async def test_a_child_task_goes_at_the_priority_its_task_declares(
    make_app: Callable[..., App], publish_on_commit: bool
) -> None:
    """A suspension's child is written as a submit of its task writes it: at the task's
    declared level, on that level's stream, whether the worker publishes it at the suspension's
    commit or the dispatcher does."""
    started: list[int] = []
    app = prioritized_app(make_app, started, publish_on_commit=publish_on_commit)

    @app.task(name="urgent", queue="jobs", priority=2)
    async def urgent(ctx: TaskContext[int], n: int) -> int:
        return n

    @app.task(name="parent", queue="jobs")
    async def parent(ctx: TaskContext[int], n: int) -> int:
        journal = current_journal()
        assert journal is not None
        return int(await journal.child(urgent, n)) + 1

    submit(app, "parent", 1)
    await dispatch_all(app)
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=30)) == 1  # runs, then suspends
    await dispatch_all(app)
    with app.engine.connect() as conn:
        levels = conn.execute(
            sa.select(tasks_table.c.name, tasks_table.c.priority).where(
                tasks_table.c.namespace == app.settings.namespace
            )
        ).all()
    assert sorted(levels) == [("parent", None), ("urgent", 2)]
    client = app.runtime.transport().client
    assert await client.xlen(keys(app).level_stream(2)) == 1
    await app.aclose()


async def test_the_reconciler_finds_a_waiting_prioritized_entry_on_its_level_stream(
    make_app: Callable[..., App],
) -> None:
    """A task of a prioritized queue that waits in its level's backlog past the reconcile grace
    is still there: the reconciler looks for its entry on its level stream, and sends nothing
    again."""
    started: list[int] = []
    clock = FrozenClock()
    app = prioritized_app(make_app, started, clock=clock)
    task_ids = [submit(app, "job", 1, priority=2), submit(app, "job", 2)]
    await dispatch_all(app)
    clock.advance(app.settings.reconcile_grace + timedelta(seconds=1))
    report = await app.reap_once()
    assert report.reconciled == 0
    assert [app.get_task(i).delivery for i in task_ids] == [0, 0]
    await app.aclose()
