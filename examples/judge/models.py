"""The judge's own tables: problems with their test cases, and submissions with their verdicts.

They live next to the runtime's ``dt_*`` tables (same database, same transactions) and are
prefixed ``judge_``. Creating them is explicit, like the runtime's: see ``app.create_tables``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

__all__ = ["Language", "Problem", "Submission", "SubmissionStatus", "Verdict"]


class Verdict(StrEnum):
    """How a submission (or one of its test cases) was judged."""

    ACCEPTED = "Accepted"
    WRONG_ANSWER = "Wrong Answer"
    TIME_LIMIT_EXCEEDED = "Time Limit Exceeded"
    RUNTIME_ERROR = "Runtime Error"
    MEMORY_LIMIT_EXCEEDED = "Memory Limit Exceeded"
    COMPILE_ERROR = "Compile Error"
    SYSTEM_ERROR = "System Error"  # the judge itself kept failing (all attempts used)


class SubmissionStatus(StrEnum):
    """Where a submission is in its life: waiting, being judged, or holding a final verdict."""

    PENDING = "Pending"
    JUDGING = "Judging"
    DONE = "Done"


class Language(StrEnum):
    """Languages the sandbox can run."""

    PYTHON = "python"


def _now() -> datetime:
    return datetime.now(UTC)


class Problem(SQLModel, table=True):
    """A problem: limits and test cases (``[{"input": ..., "expected": ...}, ...]``)."""

    __tablename__ = "judge_problems"

    id: str = Field(primary_key=True, max_length=64, description="A slug, e.g. 'a-plus-b'.")
    title: str = Field(max_length=200)
    time_limit_ms: int = Field(default=1000, gt=0)
    memory_limit_mb: int = Field(default=64, gt=0)
    tests: list[dict[str, str]] = Field(default_factory=list, sa_type=sa.JSON)


class Submission(SQLModel, table=True):
    """One submitted solution and, once judged, its verdict.

    ``generation`` is the judge task's generation the row waits for (a rejudge bumps it in the
    same transaction as ``App.rerun``); ``judged_generation`` is the generation whose verdict is
    stored. They are equal when ``status`` is ``Done``.
    """

    __tablename__ = "judge_submissions"

    id: int | None = Field(default=None, primary_key=True)
    problem_id: str = Field(foreign_key="judge_problems.id", max_length=64, index=True)
    user_id: str = Field(max_length=64, index=True)
    language: str = Field(max_length=16)
    code: str = Field(sa_type=sa.Text)
    status: str = Field(default=SubmissionStatus.PENDING, max_length=16)
    verdict: str | None = Field(default=None, max_length=32)
    score: int | None = None
    details: list[dict[str, Any]] | None = Field(default=None, sa_type=sa.JSON)
    generation: int = 0
    judged_generation: int | None = None
    request_id: str = Field(max_length=128, unique=True)
    task_id: str | None = Field(default=None, max_length=36)
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    judged_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
