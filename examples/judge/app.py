"""The judge on durable_tasks: a submission row and its judge task commit together; the
verdict is written by an on-commit hook inside the runtime's fenced result transaction, so a
stale execution (after a rejudge, or a zombie worker) can never overwrite it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from durable_tasks import App, Task, TaskContext

from .models import Language, Problem, Submission, SubmissionStatus, Verdict
from .problems import seed_problems
from .sandbox import JudgeFunction, JudgeResult, judge_submission

__all__ = [
    "JUDGE_QUEUE",
    "JUDGE_TASK",
    "JUDGE_TIMEOUT",
    "JudgeError",
    "JudgeRequest",
    "RequestIdReusedError",
    "SubmissionNotFoundError",
    "UnknownProblemError",
    "UnsupportedLanguageError",
    "build_app",
    "create_tables",
    "get_submission",
    "init_db",
    "install_judge",
    "rejudge",
    "submit_solution",
]

JUDGE_TASK = "judge.run"
JUDGE_QUEUE = "judge"
#: Bounds one judging attempt; every shipped problem's worst case fits well inside it.
JUDGE_TIMEOUT = timedelta(seconds=60)


class JudgeError(Exception):
    """Base of the judge's own errors."""


class UnknownProblemError(JudgeError):
    """No problem with that id."""


class UnsupportedLanguageError(JudgeError):
    """The sandbox cannot run that language."""


class SubmissionNotFoundError(JudgeError):
    """No submission with that id."""


class RequestIdReusedError(JudgeError):
    """A request id already names a different submission (a client bug, not a retry)."""


class JudgeRequest(BaseModel):
    """The task payload: which submission to judge (the code stays in its row)."""

    submission_id: int


def build_app(**settings: Any) -> App:
    """An App (``settings`` are forwarded to ``App(...)``) with the judge task registered."""
    app = App(tables=[Problem, Submission], **settings)  # init-db / create_all makes them too
    install_judge(app)
    return app


def install_judge(app: App, *, judge: JudgeFunction = judge_submission) -> Task[JudgeRequest, Any]:
    """Register ``judge.run`` and its verdict hook on ``app``; ``judge`` is the sandbox to use."""

    @app.task(name=JUDGE_TASK, queue=JUDGE_QUEUE, max_attempts=3, timeout=JUDGE_TIMEOUT)
    def run_judge(ctx: TaskContext[JudgeRequest], request: JudgeRequest) -> JudgeResult:
        # May run more than once (at-least-once): judging is a pure function of the code and the
        # problem, so a second run only costs time. The verdict itself is written by the hook.
        with Session(app.engine, expire_on_commit=False) as session:
            submission = session.get(Submission, request.submission_id)
            if submission is None:
                raise SubmissionNotFoundError(f"submission {request.submission_id} does not exist")
            problem = session.get(Problem, submission.problem_id)
            if problem is None:
                raise UnknownProblemError(f"problem {submission.problem_id!r} does not exist")
            # Pending -> Judging only for the generation the row waits for: an older execution
            # that started before a rejudge cannot mark the new generation as being judged.
            session.exec(
                sa.update(Submission)
                .where(
                    col(Submission.id) == request.submission_id,
                    col(Submission.generation) == ctx.generation,
                    col(Submission.status) == SubmissionStatus.PENDING,
                )
                .values(status=SubmissionStatus.JUDGING)
            )
            session.commit()  # no transaction stays open while the code runs
            code = submission.code
        # Stop between test cases once this attempt is fenced out or past its timeout.
        return judge(problem, code, should_stop=ctx.cancelled.is_set)

    @run_judge.on_commit
    def record_verdict(session: Session, ctx: TaskContext[JudgeRequest], result: JudgeResult) -> None:
        # Runs inside the fenced result transaction: only the current generation's latest
        # attempt gets here, and this write commits or rolls back with the task's result.
        submission = session.get(Submission, ctx.payload.submission_id)
        if submission is None:
            return
        submission.status = SubmissionStatus.DONE
        submission.verdict = result.verdict
        submission.score = result.score
        submission.details = [d.model_dump(mode="json") for d in result.details]
        submission.judged_generation = ctx.generation
        submission.judged_at = datetime.now(UTC)
        session.add(submission)

    @run_judge.on_failure
    def record_system_error(session: Session, ctx: TaskContext[JudgeRequest], error: BaseException) -> None:
        # Every attempt failed (the judge, not the submission): say so, fenced like a verdict.
        if ctx.payload is None:
            return
        submission = session.get(Submission, ctx.payload.submission_id)
        if submission is None or submission.generation != ctx.generation:
            return
        submission.status = SubmissionStatus.DONE
        submission.verdict = Verdict.SYSTEM_ERROR
        submission.score = 0
        submission.judged_generation = ctx.generation
        submission.judged_at = datetime.now(UTC)
        session.add(submission)

    return run_judge


def create_tables(app: App) -> None:
    """Create the runtime's tables and the judge's (idempotent)."""
    app.tables = list({*app.tables, Problem, Submission})
    app.create_all()


def init_db(app: App) -> int:
    """Create every table and seed the shipped problems; returns how many problems were added."""
    create_tables(app)
    with Session(app.engine) as session:
        return seed_problems(session)


def submit_solution(
    app: App,
    session: Session,
    problem_id: str,
    user_id: str,
    language: str,
    code: str,
    request_id: str,
) -> Submission:
    """Create a Pending submission and its judge task in one transaction, and commit it.

    ``request_id`` makes the call idempotent: a retry (even a concurrent one) returns the
    submission the first call created, and no second task exists. The same request id with a
    different body raises :class:`RequestIdReusedError`. ``session`` should be fresh: this
    function owns its transaction (it must roll back and look again if a concurrent retry won).
    """
    existing = _by_request_id(session, request_id)
    if existing is not None:
        return _same_request(existing, problem_id, user_id, language, code)
    if language not in set(Language):
        supported = ", ".join(lang.value for lang in Language)
        raise UnsupportedLanguageError(f"language {language!r} is not supported (supported: {supported})")
    if session.get(Problem, problem_id) is None:
        raise UnknownProblemError(f"problem {problem_id!r} does not exist")
    submission = Submission(
        problem_id=problem_id,
        user_id=user_id,
        language=language,
        code=code,
        request_id=request_id,
        status=SubmissionStatus.PENDING,
    )
    try:
        session.add(submission)
        session.flush()  # assigns the id the task payload names
        assert submission.id is not None
        handle = app.submit(session, JUDGE_TASK, JudgeRequest(submission_id=submission.id), idempotency_key=request_id)
        if not handle.created:
            # The submission row is new but the task is not: some earlier submission with this
            # request id was deleted while its task stayed. Refuse rather than judge the wrong row.
            raise RequestIdReusedError(f"request id {request_id!r} already belongs to task {handle.id}")
        submission.task_id = handle.id
        session.commit()
    except IntegrityError:
        # A concurrent request with the same request id committed first (unique request_id).
        session.rollback()
        existing = _by_request_id(session, request_id)
        if existing is None:
            raise
        return _same_request(existing, problem_id, user_id, language, code)
    except BaseException:
        session.rollback()
        raise
    session.refresh(submission)
    return submission


def rejudge(app: App, session: Session, submission_id: int) -> Submission:
    """Judge a submission again under a new task generation, and commit.

    ``App.rerun`` and the row's reset to Pending share one transaction; every execution of an
    older generation is fenced out from the commit on, so only the new verdict can land.
    """
    submission = get_submission(session, submission_id)
    if submission.task_id is None:
        raise JudgeError(f"submission {submission_id} has no judge task")
    try:
        submission.generation = app.rerun(session, submission.task_id)
        submission.status = SubmissionStatus.PENDING
        session.add(submission)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    session.refresh(submission)
    return submission


def get_submission(session: Session, submission_id: int) -> Submission:
    """The submission, or :class:`SubmissionNotFoundError`."""
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise SubmissionNotFoundError(f"submission {submission_id} does not exist")
    return submission


def _by_request_id(session: Session, request_id: str) -> Submission | None:
    return session.exec(select(Submission).where(Submission.request_id == request_id)).first()


def _same_request(existing: Submission, problem_id: str, user_id: str, language: str, code: str) -> Submission:
    if (existing.problem_id, existing.user_id, existing.language, existing.code) != (
        problem_id,
        user_id,
        language,
        code,
    ):
        raise RequestIdReusedError(f"request id {existing.request_id!r} was used for a different submission")
    return existing
