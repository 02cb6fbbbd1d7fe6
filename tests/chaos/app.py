"""The chaos App: a judge-style task whose every committed final write leaves an audit row.

The processes the harness spawns load it as ``tests.chaos.app:app``; the App is built on first
access from ``DT_*`` environment variables (so importing this module has no side effect).

``chaos.judge(ctx, {sub, poison, hold_ms})`` does a little CPU work (hashing), sleeps a random
few milliseconds (plus ``hold_ms``), and returns a verdict naming the generation and attempt
that produced it. Its ``on_commit`` hook inserts a row into ``chaos_final_writes`` inside the
fenced result transaction: one row per committed final write, so a duplicate or a stale write
shows up as an extra row. A ``poison`` payload SIGKILLs the worker process on every delivery.

With ``DT_CHAOS_HISTORY_DIR`` set, every body execution appends ``exec`` invoke/ok events to
the history log (the checker counts executions with them: the body is at-least-once).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.orm import Session
from sqlmodel import Field, SQLModel

from durable_tasks import App, Task, TaskContext, failpoints

from .history import HistoryWriter

__all__ = [
    "QUEUE",
    "TASK_NAME",
    "ChaosFinalWrite",
    "Job",
    "build_app",
    "create_chaos_tables",
    "final_writes_table",
    "register",
]

TASK_NAME = "chaos.judge"
QUEUE = "chaos"
#: Hash rounds per execution: a little CPU work, about a millisecond.
WORK_ROUNDS = 400


class ChaosFinalWrite(SQLModel, table=True):
    """One committed final write (written by the on-commit hook, inside the fenced transaction)."""

    __tablename__ = "chaos_final_writes"

    id: int | None = Field(default=None, primary_key=True)
    task_id: str = Field(max_length=36, index=True)
    generation: int
    attempt: int
    pid: int
    # wall clock (epoch seconds) when the hook ran, before the commit; DOUBLE, since MySQL's FLOAT
    # (what a Python float maps to there) is single precision: epoch seconds lose minutes
    written_at: float = Field(sa_type=sa.Double)


final_writes_table: sa.Table = ChaosFinalWrite.__table__  # type: ignore[attr-defined]


class Job(BaseModel):
    """A submission to judge: ``poison`` kills its worker every time; ``hold_ms`` keeps it running;
    ``key`` is its concurrency key (submitted as ``concurrency_key``) when the App limits keys."""

    sub: int
    poison: bool = False
    hold_ms: int = 0
    key: str | None = None


_history: HistoryWriter | None = None
_rng = random.Random()


def _exec_history() -> HistoryWriter | None:
    global _history
    directory = os.environ.get("DT_CHAOS_HISTORY_DIR")
    if not directory:
        return None
    if _history is None or _history.pid != os.getpid():
        _history = HistoryWriter(Path(directory), "worker")
    return _history


def _work(sub: int) -> str:
    digest = str(sub).encode()
    for _ in range(WORK_ROUNDS):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:16]


def register(app: App, *, key_limit: int | None = None) -> Task[Job, dict[str, Any]]:
    """Register ``chaos.judge`` and its auditing on-commit hook on ``app``; with ``key_limit``,
    at most that many attempts of one ``Job.key`` run at once (durable_tasks.flow)."""

    @app.task(name=TASK_NAME, queue=QUEUE, max_attempts=3, concurrency_limit=key_limit)
    def judge(ctx: TaskContext[Job], job: Job) -> dict[str, Any]:
        history = _exec_history()
        ids = {"task_id": ctx.task_id, "generation": ctx.generation, "attempt": ctx.attempt, "delivery": ctx.delivery}
        if job.key is not None:  # the checker's key-over-limit invariant reads these
            ids |= {"ckey": job.key, "key_limit": key_limit}
        if history is not None:
            history.write("exec", "invoke", poison=job.poison, hold_ms=job.hold_ms, **ids)
        if job.poison:
            os.kill(os.getpid(), signal.SIGKILL)  # an OOM kill, a segfault: every single time
        digest = _work(job.sub)
        time.sleep(_rng.uniform(0.001, 0.008) + job.hold_ms / 1000)
        if history is not None:
            history.write("exec", "ok", **ids)
        return {"sub": job.sub, "digest": digest, "generation": ctx.generation, "attempt": ctx.attempt}

    @judge.on_commit
    def audit(session: Session, ctx: TaskContext[Job], result: dict[str, Any]) -> None:
        session.add(
            ChaosFinalWrite(
                task_id=ctx.task_id,
                generation=ctx.generation,
                attempt=ctx.attempt,
                pid=os.getpid(),
                written_at=time.time(),
            )
        )

    return judge


def create_chaos_tables(app: App) -> None:
    """The runtime's tables and ``chaos_final_writes``."""
    app.create_all()
    SQLModel.metadata.create_all(app.engine, tables=[final_writes_table])


def build_app(**overrides: Any) -> App:
    """An App with the chaos task; settings from ``DT_*`` variables unless overridden. The
    concurrency limit per ``Job.key`` comes from ``key_limit`` or ``DT_CHAOS_KEY_LIMIT``."""
    key_limit = int(overrides.pop("key_limit", None) or os.environ.get("DT_CHAOS_KEY_LIMIT") or 0)
    app = App(**overrides)
    register(app, key_limit=key_limit or None)
    return app


_app: App | None = None


def __getattr__(name: str) -> App:
    # ``tests.chaos.app:app`` for the CLI: built on first access, from the environment.
    global _app
    if name != "app":
        raise AttributeError(name)
    if _app is None:
        failpoints.enable_from_environment()  # the harness arms a process's failpoints with DT_FAILPOINTS
        _app = build_app()
    return _app
