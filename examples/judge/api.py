"""HTTP API for the judge: submit (idempotent by request id), read, rejudge.

The API only writes rows: workers (``durable-tasks run examples.judge.main:app``) judge.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, select

from durable_tasks import App

from .app import (
    RequestIdReusedError,
    SubmissionNotFoundError,
    UnknownProblemError,
    UnsupportedLanguageError,
    get_submission,
    rejudge,
    submit_solution,
)
from .models import Language, Problem, Submission
from .sandbox import MAX_CODE_BYTES

__all__ = ["ProblemOut", "SubmissionIn", "SubmissionOut", "create_api"]


class SubmissionIn(BaseModel):
    """``POST /submissions``: ``request_id`` is the client's idempotency key (retry with the same)."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str = Field(min_length=1, max_length=64)
    user_id: str = Field(min_length=1, max_length=64)
    language: Language
    code: str = Field(min_length=1, max_length=MAX_CODE_BYTES)
    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[!-~]+$")  # printable ASCII, no spaces


class SubmissionOut(BaseModel):
    """A submission as the API shows it (without its code)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    problem_id: str
    user_id: str
    language: str
    status: str
    verdict: str | None
    score: int | None
    details: list[dict[str, Any]] | None
    generation: int
    judged_generation: int | None
    request_id: str
    task_id: str | None
    created_at: datetime
    judged_at: datetime | None


class ProblemOut(BaseModel):
    """A problem's statement and limits (test cases stay hidden)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    title: str
    time_limit_ms: int
    memory_limit_mb: int


def _session(request: Request) -> Iterator[Session]:
    app: App = request.app.state.durable_app
    with Session(app.engine) as session:
        yield session


# Module level: with postponed annotations, FastAPI resolves endpoint annotations in the
# module's globals.
SessionDep = Annotated[Session, Depends(_session)]


def create_api(app: App) -> FastAPI:
    """A FastAPI app writing submissions through ``app`` (its engine and its judge task)."""
    api = FastAPI(title="durable_tasks judge example")
    api.state.durable_app = app

    @api.get("/problems")
    def list_problems(db: SessionDep) -> list[ProblemOut]:
        return [ProblemOut.model_validate(p) for p in db.exec(select(Problem).order_by(Problem.id))]

    @api.post("/submissions", status_code=status.HTTP_201_CREATED)
    def create_submission(body: SubmissionIn, db: SessionDep) -> SubmissionOut:
        """Create a submission and its judge task atomically; a retry returns the same one."""
        try:
            submission = submit_solution(
                app, db, body.problem_id, body.user_id, body.language, body.code, body.request_id
            )
        except UnknownProblemError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
        except UnsupportedLanguageError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
        except RequestIdReusedError as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        return _out(submission)

    @api.get("/submissions/{submission_id}")
    def read_submission(submission_id: int, db: SessionDep) -> SubmissionOut:
        try:
            return _out(get_submission(db, submission_id))
        except SubmissionNotFoundError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc

    @api.post("/submissions/{submission_id}/rejudge", status_code=status.HTTP_202_ACCEPTED)
    def rejudge_submission(submission_id: int, db: SessionDep) -> SubmissionOut:
        """Judge again under a new generation; a still-running older judging is fenced out."""
        try:
            return _out(rejudge(app, db, submission_id))
        except SubmissionNotFoundError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc

    return api


def _out(submission: Submission) -> SubmissionOut:
    return SubmissionOut.model_validate(submission)
