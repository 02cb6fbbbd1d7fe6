"""A rolling deploy: the producer ships a task before the dispatcher and workers know it.

The task is held PENDING (backoff, a warning naming task and queue, a metric), runs once a
process that knows it starts, and is dead-lettered only after ``unknown_task_grace``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks.doctor import Level, diagnose, gather_facts
from durable_tasks.records import OutboxState, outbox_table
from durable_tasks.store.engine import read_only
from durable_tasks.transport.keys import CONSUMER_GROUP
from tests.helpers import submit, wait_until

pytestmark = pytest.mark.anyio


class Grade(BaseModel):
    n: int


def register_grade(app: App) -> None:
    """The new code: the task the producer already submits."""

    @app.task(name="grade_v2", queue="grading")
    def grade(ctx: TaskContext[Grade], p: Grade) -> int:
        return p.n * 10


def outbox_rows(app: App, task_id: str) -> list[tuple[str, int, str | None]]:
    o = outbox_table.c
    with read_only(app.engine).connect() as conn:
        rows = conn.execute(
            sa.select(o.state, o.attempts, o.last_error).where(o.task_id == task_id).order_by(o.id)
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


async def test_a_task_no_running_process_knows_is_held_then_runs_when_one_does(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    producer = make_app()
    register_grade(producer)
    old_runtime = make_app()  # the previous release: no grade_v2
    task_id = submit(producer, "grade_v2", {"n": 4})

    with caplog.at_level(logging.WARNING, logger="durable_tasks.dispatcher"):
        # Several passes over a few seconds' worth of backoff: each holds it again.
        for _ in range(3):
            await wait_until(old_runtime.dispatch_once, what="the held row to be due again", timeout=10)
    assert old_runtime.get_task(task_id).state is TaskState.PENDING
    [(state, attempts, last_error)] = outbox_rows(old_runtime, task_id)
    assert (state, attempts) == (OutboxState.PENDING, 3)
    assert last_error is not None
    assert "unknown task name 'grade_v2' (queue 'grading')" in last_error
    warnings = [r.getMessage() for r in caplog.records if "is not registered in this process" in r.getMessage()]
    assert len(warnings) == 3
    assert "task name 'grade_v2' (queue 'grading')" in warnings[0]
    assert "dead-lettered if still unknown at" in warnings[0]
    assert (await old_runtime.stats())["grading"].unknown_held == 1  # status prints it
    [finding] = [f for f in diagnose(await gather_facts(old_runtime)) if f.check == "unknown-tasks"]
    assert finding.level is Level.WARNING
    assert "(grading: 1)" in finding.message

    new_runtime = make_app()  # the new release starts
    register_grade(new_runtime)
    await wait_until(new_runtime.dispatch_once, what="the held row to be dispatched", timeout=10)
    assert await new_runtime.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = new_runtime.get_task(task_id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, 40)
    assert all(q.unknown_held == 0 for q in (await old_runtime.stats()).values())
    await old_runtime.aclose()
    await new_runtime.aclose()


async def test_a_task_still_unknown_after_the_grace_is_dead_lettered(make_app: Callable[..., App]) -> None:
    clock = FrozenClock()
    producer = make_app(clock=clock)
    register_grade(producer)
    old_runtime = make_app(clock=clock, unknown_task_grace=timedelta(minutes=10))
    task_id = submit(producer, "grade_v2", {"n": 4})

    assert await old_runtime.dispatch_once() == 1
    clock.advance(timedelta(minutes=9))
    assert await old_runtime.dispatch_once() == 1
    assert old_runtime.get_task(task_id).state is TaskState.PENDING
    clock.advance(timedelta(minutes=1))
    assert await old_runtime.dispatch_once() == 1
    info = old_runtime.get_task(task_id)
    assert (info.state, info.error_type) == (TaskState.DEAD, "UnknownTask")
    assert info.error_message is not None
    assert "unknown task name 'grade_v2'" in info.error_message
    assert "unknown_task_grace (0:10:00)" in info.error_message
    assert [r[0] for r in outbox_rows(old_runtime, task_id)] == [OutboxState.DEAD]
    await old_runtime.aclose()


async def test_a_child_dead_lettered_as_unknown_resumes_its_parent(make_app: Callable[..., App]) -> None:
    # A parent waits for a child whose name the dispatching release does not know: the child's
    # end by the dispatcher settles the parent's slot, as a worker's or the reaper's end does.
    producer = make_app()
    register_grade(producer)

    @producer.task(name="review", queue="grading")
    async def review(ctx: TaskContext[int], n: int) -> int:
        assert ctx.journal is not None
        return int(await ctx.journal.child("grade_v2", Grade(n=n), label="grade"))

    parent_id = submit(producer, "review", 4)
    assert await producer.dispatch_once() == 1
    assert await producer.work(max_tasks=1, timeout=timedelta(seconds=20)) == 1  # suspends: submits its child
    assert producer.get_task(parent_id).state is TaskState.WAITING
    [step] = producer.steps(parent_id)
    assert step.child_task_id is not None
    old_runtime = make_app(unknown_task_grace=timedelta(0))  # knows neither task
    assert await old_runtime.dispatch_once() == 1
    assert old_runtime.get_task(step.child_task_id).state is TaskState.DEAD
    [step] = producer.steps(parent_id)
    assert (step.done, producer.get_task(parent_id).state) == (True, TaskState.PENDING)  # a new delivery
    await old_runtime.aclose()
    await producer.aclose()


def register_grade_v1(app: App) -> None:
    """The previous release: another task on the same queue, so its workers read the queue."""

    @app.task(name="grade_v1", queue="grading")
    def grade(ctx: TaskContext[Grade], p: Grade) -> int:
        return p.n


async def test_a_worker_leaves_a_task_it_does_not_know_for_one_that_does(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    new_release = make_app()
    register_grade(new_release)
    old_release = make_app()
    register_grade_v1(old_release)
    task_id = submit(new_release, "grade_v2", {"n": 5})
    assert await new_release.dispatch_once() == 1

    with caplog.at_level(logging.WARNING, logger="durable_tasks.unknown"):
        assert await old_release.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = new_release.get_task(task_id)
    assert (info.state, info.delivery, info.attempts) == (TaskState.PENDING, 1, ())  # no attempt spent
    assert [r[0] for r in outbox_rows(new_release, task_id)] == [OutboxState.SENT, OutboxState.PENDING]
    transport = old_release.runtime.transport()
    [stream] = [key for key, shadow, _ in transport.streams("grading") if not shadow]
    assert (await transport.client.xpending(stream, CONSUMER_GROUP))["pending"] == 0  # acknowledged
    [warning] = [r.getMessage() for r in caplog.records if r.name == "durable_tasks.unknown"]
    assert "task name 'grade_v2' (queue 'grading') is not registered in worker" in warning

    await wait_until(new_release.dispatch_once, what="the new delivery to be published", timeout=10)
    assert await new_release.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = new_release.get_task(task_id)
    assert (info.state, info.result, len(info.attempts)) == (TaskState.SUCCEEDED, 50, 1)
    await old_release.aclose()
    await new_release.aclose()


async def test_running_processes_of_the_old_release_hold_a_new_task_until_the_new_release_runs_it(
    make_app: Callable[..., App],
) -> None:
    """The issue's must-show, with whole processes' loops (dispatcher, worker, reaper)."""
    new_release = make_app()
    register_grade(new_release)
    old_release = make_app()
    register_grade_v1(old_release)
    task_id = submit(new_release, "grade_v2", {"n": 6})
    stop_old, stop_new = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: old_release.run(stop=stop_old))
        # Ten holds, each backed off (up to backoff_max): a few seconds of the old release alone.
        await wait_until(
            lambda: outbox_rows(old_release, task_id)[-1][1] >= 10, what="ten holds of the row", timeout=30
        )
        assert old_release.get_task(task_id).state is TaskState.PENDING
        tg.start_soon(lambda: new_release.run(stop=stop_new))
        await wait_until(
            lambda: new_release.get_task(task_id).state is TaskState.SUCCEEDED, what="the new release to run it"
        )
        stop_old.set()
        stop_new.set()
    info = new_release.get_task(task_id)
    assert (info.result, len(info.attempts)) == (60, 1)
    await old_release.aclose()
    await new_release.aclose()
