"""The public API as a type checker sees it: ``mypy`` fails when a public signature loses its
types. Nothing here runs (pytest does not collect it); every line is checked.

``assert_type`` pins what each call returns; a ``# type: ignore[...]`` marks a call that must be
refused (mypy --strict reports an ignore that is no longer needed, so a signature that starts
accepting anything fails too).
"""

from __future__ import annotations

from datetime import timedelta
from typing import assert_type

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import Session

from durable_tasks import (
    App,
    AttemptOutcome,
    PruneReport,
    QueueStats,
    ReapReport,
    Task,
    TaskContext,
    TaskHandle,
    TaskInfo,
)


class Job(BaseModel):
    n: int


def declaring(app: App) -> None:
    @app.task(name="sync", queue="jobs", timeout=timedelta(seconds=5))
    def double(ctx: TaskContext[Job], job: Job) -> int:
        return 2 * job.n

    @app.task(name="async")
    async def shout(ctx: TaskContext[Job], job: Job) -> str:
        return str(job.n)

    assert_type(double, Task[Job, int])
    assert_type(shout, Task[Job, str])

    @double.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        assert_type(result, int)
        assert_type(ctx.payload, Job)

    @shout.on_failure
    def report(session: Session, ctx: TaskContext[Job], error: BaseException) -> None:
        return None

    def wrong(session: Session, ctx: TaskContext[Job], result: str) -> None:
        return None

    double.on_commit(wrong)  # type: ignore[arg-type]


def submitting(app: App, session: Session, task: Task[Job, int]) -> None:
    assert_type(task.submit(session, Job(n=1), idempotency_key="k"), TaskHandle)
    assert_type(app.submit(session, "sync", {"n": 1}), TaskHandle)
    assert_type(task.submit_many(session, [(Job(n=1), "a")], delay=timedelta(seconds=5)), list[TaskHandle])
    task.submit(session, Job(n=1), delay=5)  # type: ignore[arg-type]
    task.submit(session, Job(n=1), idempotency="k")  # type: ignore[call-arg]
    task.submit_many(session, [(Job(n=1), "a")], idempotency_key="k")  # type: ignore[call-arg]
    assert_type(app.rerun(session, "task-id"), int)
    assert_type(app.cancel(session, "task-id"), bool)


async def submitting_async(app: App, session: AsyncSession, task: Task[Job, int]) -> None:
    assert_type(await task.asubmit(session, Job(n=1), priority=1), TaskHandle)
    assert_type(await app.asubmit(session, task, Job(n=1), concurrency_key="user:42"), TaskHandle)
    await app.asubmit(session, task, Job(n=1), priority="high")  # type: ignore[arg-type]
    await task.asubmit(session, Job(n=1), not_before=5)  # type: ignore[arg-type]


def reading(app: App) -> None:
    info = app.get_task("task-id")
    assert_type(info, TaskInfo)
    assert_type(info.attempts[0].outcome, AttemptOutcome | None)
    assert_type(app.prune(timedelta(days=7)), PruneReport)


async def running(app: App) -> None:
    assert_type(await app.dispatch_once(), int)
    assert_type(await app.work(max_tasks=1, timeout=timedelta(seconds=1)), int)
    assert_type(await app.reap_once(), ReapReport)
    assert_type(await app.stats(), dict[str, QueueStats])


def configuring() -> None:
    App("sqlite:///dt.sqlite3", lease_timeout=timedelta(seconds=30), batch_size=100)
    App(lease_timeout=30)  # type: ignore[arg-type]
    App(no_such_setting=1)  # type: ignore[call-arg]
