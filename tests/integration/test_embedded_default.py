"""App() with no URLs: a SQLite file (WAL, synchronous=FULL) and an embedded Valkey, whose
wake channel ends the dispatchers' poll at each committed outbox write."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, Task, TaskContext, TaskState, current_journal
from durable_tasks.embedded import stop_valkey, valkey_socket
from durable_tasks.transport.keys import wake_channel
from tests.helpers import wait_until

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


#: Far longer than any deadline below: only a wake-up can explain a run finished sooner.
POLL = timedelta(hours=1)


def chained_tasks(app: App) -> Task[int, int]:
    """``parent(n)``: two children in turn, ``double(n)`` then ``double`` of that, plus one."""

    @app.task(name="double", queue="jobs")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    @app.task(name="parent", queue="jobs")
    async def parent(ctx: TaskContext[int], n: int) -> int:
        journal = current_journal()
        assert journal is not None
        first = await journal.child(double, n)  # suspends; resumed when the child commits
        return int(await journal.child(double, first)) + 1

    return parent


async def test_the_embedded_default_wakes_its_dispatcher_at_a_submit_and_at_each_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DT_DATABASE_URL", raising=False)
    monkeypatch.delenv("DT_REDIS_URL", raising=False)
    data_dir = tmp_path / "dt"
    app = App(namespace="embedded-wake", data_dir=data_dir, poll_interval=POLL)
    chained_tasks(app)
    app.create_all()
    # Another App on the same directory that only submits (it never asks for the server).
    producer = App(namespace="embedded-wake", data_dir=data_dir, poll_interval=POLL)
    parent = chained_tasks(producer)
    client: Any = redis.Redis.from_url(app.redis_url)
    channel = wake_channel(app.settings.namespace)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(app.run, reaper=False, stop=stop))
            await wait_until(lambda: client.pubsub_numsub(channel)[0][1], what="the dispatcher's subscription")
            with Session(producer.engine) as session:
                handle = parent.submit(session, 5)
                session.commit()
            # The submit, two suspensions' children and two resumes: five hops, each an hour's poll.
            await wait_until(lambda: app.get_task(handle.id).state is TaskState.SUCCEEDED, what="the run", timeout=60)
            stop.set()
        assert app.get_task(handle.id).result == 21
    finally:
        client.close()
        await app.aclose()
        await producer.aclose()
        stop_valkey(data_dir)


def test_a_commit_on_the_embedded_default_starts_no_server_for_its_wake_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DT_DATABASE_URL", raising=False)
    monkeypatch.delenv("DT_REDIS_URL", raising=False)
    app = App(namespace="embedded-idle", data_dir=tmp_path / "dt")
    parent = chained_tasks(app)
    app.create_all()
    with Session(app.engine) as session:
        handle = parent.submit(session, 1)
        session.commit()
    assert app.get_task(handle.id).state is TaskState.PENDING
    assert not valkey_socket(tmp_path / "dt").exists()
    app.engine.dispose()
