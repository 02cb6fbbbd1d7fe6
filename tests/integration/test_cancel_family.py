"""Cancelling a task that waits for its children cancels them, and theirs: nobody wants their
results any more (a rerun supersedes them the same way), and their side effects must not
happen for a cancelled run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from tests.helpers import run_until_quiet, submit

pytestmark = pytest.mark.anyio


async def test_cancelling_a_waiting_task_cancels_its_children_and_theirs(app: App) -> None:
    refunds: list[int] = []

    @app.task(name="refund", queue="jobs")
    def refund(ctx: TaskContext[int], amount: int) -> str:
        refunds.append(amount)
        return "ok"

    @app.task(name="order", queue="jobs")
    async def order(ctx: TaskContext[int], amount: int) -> str:
        assert ctx.journal is not None
        return str(await ctx.journal.child(refund, amount, label="refund"))

    @app.task(name="agent", queue="jobs")
    async def agent(ctx: TaskContext[int], amount: int) -> str:
        assert ctx.journal is not None
        return str(await ctx.journal.child(order, amount, label="order"))

    run_id = submit(app, agent, 30)
    for _ in range(2):  # the run suspends on its order, the order on its refund
        await app.dispatch_once()
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=20)) == 1
    [order_step] = app.steps(run_id)
    assert order_step.child_task_id is not None
    [refund_step] = app.steps(order_step.child_task_id)
    assert refund_step.child_task_id is not None
    with Session(app.engine) as session:
        assert app.cancel(session, run_id) is True
        session.commit()
    await run_until_quiet(app)
    states = [app.get_task(i).state for i in (run_id, order_step.child_task_id, refund_step.child_task_id)]
    assert states == [TaskState.CANCELLED] * 3
    assert refunds == [], "the cancelled run's refund still ran"


async def test_cancelling_a_child_alone_leaves_its_parent_to_resume(app: App) -> None:
    @app.task(name="step", queue="jobs")
    def step(ctx: TaskContext[int], n: int) -> int:
        return n

    @app.task(name="parent", queue="jobs")
    async def parent(ctx: TaskContext[int], n: int) -> str:
        assert ctx.journal is not None
        try:
            return str(await ctx.journal.child(step, n, label="step"))
        except Exception as exc:  # the child's cancellation reaches the parent as its failure
            return type(exc).__name__

    run_id = submit(app, parent, 1)
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=20)) == 1
    [child_step] = app.steps(run_id)
    assert child_step.child_task_id is not None
    with Session(app.engine) as session:
        assert app.cancel(session, child_step.child_task_id) is True
        session.commit()
    await run_until_quiet(app)
    info = app.get_task(run_id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, "ChildTaskFailedError")
