"""A failing attempt is reported whole: the log names the task, its id, the attempt, the
exception's type and message and carries the traceback; ``dt_attempts`` keeps the traceback
(secrets masked) and ``get_task`` returns it; an on_commit hook that raises is reported as
the hook's failure, not the body's."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, AttemptOutcome, TaskContext, TaskState
from tests.helpers import submit

pytestmark = pytest.mark.anyio


class Job(BaseModel):
    n: int


def check_the_input(n: int) -> None:
    raise ValueError(f"n={n} is odd; the database at postgresql://app:s3cret@db/prod says no")


async def test_a_failing_attempt_logs_and_stores_its_traceback(app: App, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(name="grade", queue="jobs", max_attempts=2)
    def grade(ctx: TaskContext[Job], p: Job) -> int:
        check_the_input(p.n)
        return p.n

    task_id = submit(app, "grade", {"n": 3})
    with caplog.at_level(logging.INFO, logger="durable_tasks"):
        for _ in range(2):
            assert await app.dispatch_once() == 1
            assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = app.get_task(task_id)
    assert info.state is TaskState.FAILED
    assert info.error_message == "n=3 is odd; the database at postgresql://app:***@db/prod says no"
    for attempt in info.attempts:
        assert attempt.outcome is AttemptOutcome.FAILED
        assert attempt.traceback is not None
        assert attempt.traceback.startswith("Traceback (most recent call last):")
        assert "in check_the_input" in attempt.traceback
        assert attempt.traceback.rstrip().endswith(f"ValueError: {info.error_message}")
    records = [r for r in caplog.records if r.name == "durable_tasks.attempt"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.ERROR]
    for number, record in enumerate(records, start=1):
        line = record.getMessage()
        assert f"task grade (id {task_id}, queue jobs) attempt {number} raised ValueError: n=3 is odd" in line
        assert "in check_the_input" in line
    assert "retrying at" in records[0].getMessage()
    assert "FAILED, no attempts left" in records[1].getMessage()
    assert "s3cret" not in caplog.text


async def test_an_on_commit_hook_that_raises_is_reported_as_the_hooks_failure(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name="hooked", queue="jobs", max_attempts=2)
    def hooked(ctx: TaskContext[Job], p: Job) -> int:
        return ctx.attempt

    @hooked.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        if ctx.attempt == 1:
            raise LookupError("no submission row to write the verdict into")

    task_id = submit(app, "hooked", {"n": 1})
    with caplog.at_level(logging.INFO, logger="durable_tasks"):
        for _ in range(2):
            await app.dispatch_once()
            await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    info = app.get_task(task_id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, 2)
    first, second = info.attempts
    assert (first.outcome, first.error_type) == (AttemptOutcome.HOOK_FAILED, "LookupError")
    assert first.error_message == "in the on_commit hook: no submission row to write the verdict into"
    assert first.retry_reason is not None
    assert "in the on_commit hook" in first.retry_reason
    assert first.traceback is not None
    assert "in save" in first.traceback
    assert (second.outcome, second.traceback) == (AttemptOutcome.SUCCEEDED, None)
    [record] = [r for r in caplog.records if r.name == "durable_tasks.attempt"]
    assert record.getMessage().startswith(
        f"the on_commit hook of task hooked (id {task_id}, queue jobs) attempt 1 raised LookupError"
    )


async def test_a_task_failed_by_its_hook_says_so_in_its_error(app: App) -> None:
    @app.task(name="hook_always_fails", queue="jobs", max_attempts=1)
    def body(ctx: TaskContext[Job], p: Job) -> int:
        return p.n

    @body.on_commit
    def save(session: Session, ctx: TaskContext[Job], result: int) -> None:
        raise PermissionError("the verdicts table is read-only")

    task_id = submit(app, "hook_always_fails", {"n": 1})
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    info = app.get_task(task_id)
    assert (info.state, info.result, info.error_type) == (TaskState.FAILED, None, "PermissionError")
    assert info.error_message == "in the on_commit hook: the verdicts table is read-only"
    assert [a.outcome for a in info.attempts] == [AttemptOutcome.HOOK_FAILED]
