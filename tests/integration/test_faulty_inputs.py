"""More hostile inputs: wrong-typed keys, huge or odd exceptions, skewed worker clocks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.clock import system_clock
from durable_tasks.records import OutboxState, outbox_table, tasks_table
from durable_tasks.worker import Worker
from tests.helpers import keys, submit

pytestmark = pytest.mark.anyio


async def test_a_dedup_key_holding_the_wrong_type_backs_off_and_recovers(make_app: Callable[..., App]) -> None:
    app = make_app(publish_on_commit=False)  # the dispatcher is the first to use the key

    @app.task(name="plain", queue="jobs")
    def plain(ctx: TaskContext[int], n: int) -> int:
        return n

    task_id = submit(app, "plain", 1)
    dedup = keys(app).dedup(task_id, 0, 0)
    await app.runtime.transport().client.lpush(dedup, "not a string")  # GET on a list: WRONGTYPE
    assert await app.dispatch_once() == 1
    with app.runtime.store.read_engine.connect() as conn:
        row = conn.execute(outbox_table.select().where(outbox_table.c.task_id == task_id)).one()
    assert (row.state, row.attempts) == (OutboxState.PENDING, 1)
    assert row.last_error is not None
    assert "WRONGTYPE" in row.last_error
    await app.runtime.transport().client.delete(dedup)
    app.clock = lambda: system_clock() + timedelta(seconds=5)  # past the backoff
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state == TaskState.SUCCEEDED


async def test_a_payload_edited_after_its_entry_went_out_fails_at_the_decode(app: App) -> None:
    @app.task(name="plain", queue="jobs")
    def plain(ctx: TaskContext[int], n: int) -> int:
        return n

    task_id = submit(app, "plain", 1)
    assert app.runtime.wakeups.flush()  # the entry is out: the dispatcher's check comes too late
    with app.engine.begin() as conn:
        conn.execute(sa.update(tasks_table).where(tasks_table.c.id == task_id).values(payload='{"x":'))
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = app.get_task(task_id)
    assert info.state == TaskState.FAILED  # not retried: a retry would decode the same bytes
    assert info.error_message is not None
    assert "stored payload of task 'plain' no longer validates" in info.error_message


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = anyio.Lock()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("cannot pickle this exception")


async def test_huge_and_unpicklable_exceptions_are_recorded_as_text(app: App) -> None:
    @app.task(name="huge", queue="jobs", max_attempts=1)
    def huge(ctx: TaskContext[int], n: int) -> int:
        raise ValueError("x" * 1_000_000)

    @app.task(name="odd", queue="jobs", max_attempts=1)
    def odd(ctx: TaskContext[int], n: int) -> int:
        raise Unpicklable()

    big, strange = submit(app, "huge", 1), submit(app, "odd", 1)
    await app.dispatch_once()
    assert await app.work(max_tasks=2, timeout=timedelta(seconds=10)) == 2
    big_info, odd_info = app.get_task(big), app.get_task(strange)
    assert (big_info.state, odd_info.state) == (TaskState.FAILED, TaskState.FAILED)
    assert big_info.error_message is not None
    assert len(big_info.error_message) == 4000  # bounded
    assert (odd_info.error_type, odd_info.error_message) == ("Unpicklable", "holds a lock")


async def test_a_worker_whose_clock_is_behind_cannot_overwrite_a_newer_attempt(make_app: Callable[..., App]) -> None:
    behind = make_app(clock=lambda: system_clock() - timedelta(hours=1))
    honest = make_app()
    started, release = anyio.Event(), anyio.Event()
    for app in (behind, honest):

        @app.task(name="slow", queue="jobs")
        async def slow(ctx: TaskContext[int], n: int) -> str:
            if ctx.attempt == 1:
                started.set()
                await release.wait()
                return "late"
            return "current"

    task_id = submit(honest, "slow", 1)
    await honest.dispatch_once()
    # A duplicate of the delivery (what a replay would leave) reaches the honest worker.
    entry = (await honest.runtime.transport().client.xrange(keys(honest).stream))[0][1]
    await honest.runtime.transport().client.xadd(keys(honest).stream, entry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: Worker(behind.runtime).run(max_tasks=1, timeout=timedelta(seconds=20)))
        await started.wait()
        # The skewed worker's lease looks expired to everyone else: a duplicate can start...
        assert await Worker(honest.runtime).run(max_tasks=1, timeout=timedelta(seconds=10)) == 1
        release.set()
    info = honest.get_task(task_id)
    # ...but only the newest attempt's result lands; the late one is fenced out.
    assert (info.state, info.result, info.attempt) == (TaskState.SUCCEEDED, "current", 2)
    assert [a.outcome for a in info.attempts] == ["fenced_out", "succeeded"]
