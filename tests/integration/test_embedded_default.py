"""App() with no URLs: a SQLite file (WAL, synchronous=FULL) and an embedded Valkey."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.embedded import stop_valkey

pytestmark = pytest.mark.anyio


class Echo(BaseModel):
    text: str


async def test_embedded_default_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DT_DATABASE_URL", raising=False)
    monkeypatch.delenv("DT_REDIS_URL", raising=False)
    app = App(namespace="embedded", data_dir=tmp_path / "dt")
    try:

        @app.task(name="echo", queue="echo")
        def echo(ctx: TaskContext[Echo], p: Echo) -> str:
            return p.text.upper()

        app.create_all()
        assert app.engine.dialect.name == "sqlite"
        with app.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert (tmp_path / "dt" / "durable_tasks.sqlite3").exists()
        with Session(app.engine) as s:
            task_id = echo.submit(s, Echo(text="hi")).id
            s.commit()
        assert app.redis_url.startswith("unix://")
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
        info = app.get_task(task_id)
        assert (info.state, info.result) == (TaskState.SUCCEEDED, "HI")
        await app.aclose()
    finally:
        stop_valkey(tmp_path / "dt")


def test_sqlite_writers_take_the_lock_up_front(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://unused", "ns")
    statements: list[str] = []
    sa.event.listen(app.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with app.engine.begin() as conn:
        conn.execute(sa.text("SELECT 1"))
    assert statements[0] == "BEGIN IMMEDIATE"
