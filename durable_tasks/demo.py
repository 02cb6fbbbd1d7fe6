"""``durable-tasks demo``: a small end-to-end run on the embedded default.

Submits tasks together with business rows, runs dispatcher, worker and reaper in one process,
makes some tasks fail transiently, and checks the invariants at the end: every task settled,
each business row written exactly once by the fenced hook. Exit code 1 if any check fails.
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import timedelta
from pathlib import Path

import anyio
import sqlalchemy as sa
from pydantic import BaseModel
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlmodel import Field, Session, SQLModel, select

from .app import App
from .records import TaskState
from .tasks import TaskContext

__all__ = ["run_demo"]


class DemoResult(SQLModel, table=True):
    """The demo's business table: one row per task, written by the fenced on-commit hook."""

    __tablename__ = "dt_demo_results"
    task_id: str = Field(primary_key=True, max_length=36)
    n: int
    value: int


class Collatz(BaseModel):
    """Payload: count the Collatz steps of ``n``; ``flaky`` tasks fail on their first attempt."""

    n: int
    flaky: bool = False


def _collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def build_app(data_dir: str) -> App:
    """The demo App on the embedded default, in a fresh namespace."""
    app = App(
        namespace=f"demo-{uuid.uuid4().hex[:8]}",
        data_dir=Path(data_dir),
        poll_interval=timedelta(milliseconds=50),
        read_block=timedelta(milliseconds=50),
        retry_backoff_initial=timedelta(milliseconds=100),
        retry_backoff_max=timedelta(milliseconds=200),
        reaper_interval=timedelta(seconds=1),
    )

    @app.task(name="demo.collatz", queue="demo", max_attempts=3)
    def collatz(ctx: TaskContext[Collatz], p: Collatz) -> int:
        if p.flaky and ctx.attempt == 1:
            raise ConnectionError("transient: downstream unavailable (first attempt)")
        return _collatz_steps(p.n)

    @collatz.on_commit
    def save(session: Session, ctx: TaskContext[Collatz], result: int) -> None:
        session.add(DemoResult(task_id=ctx.task_id, n=ctx.payload.n, value=result))

    return app


def run_demo(console: Console, *, tasks: int, data_dir: str) -> int:
    """Run the demo; returns the process exit code."""
    for stale in Path(data_dir).glob("durable_tasks.sqlite3*"):
        stale.unlink()  # the demo's own scratch database: start from an empty schema every run
    app = build_app(data_dir)
    app.create_all()
    DemoResult.metadata.create_all(app.engine, tables=[DemoResult.__table__])  # type: ignore[attr-defined]
    console.print(f"[bold]durable_tasks demo[/] · database {app.engine.url} · redis {app.redis_url}")
    ids: dict[str, int] = {}
    started = time.perf_counter()
    with Session(app.engine) as s:
        for i in range(tasks):
            h = app.submit(s, "demo.collatz", Collatz(n=27 + i, flaky=i % 10 == 0), idempotency_key=f"demo-{i}")
            ids[h.id] = 27 + i
        s.commit()
    try:
        return anyio.run(_drive, app, console, ids, started)
    finally:
        if app.settings.redis_url is None:
            from .embedded import stop_valkey

            stop_valkey(app.settings.data_dir)


async def _drive(app: App, console: Console, ids: dict[str, int], started: float) -> int:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(stop=stop))
        with Progress(console=console, transient=False) as progress:
            bar = progress.add_task("settling tasks", total=len(ids))
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline:
                done = await anyio.to_thread.run_sync(lambda: _settled_count(app, list(ids)))
                progress.update(bar, completed=done)
                if done == len(ids):
                    break
                await anyio.sleep(0.2)
        stop.set()
    await app.aclose()
    return _summarize(app, console, ids, time.perf_counter() - started)


def _settled_count(app: App, ids: list[str]) -> int:
    with app.engine.connect() as conn:
        from .records import tasks_table

        t = tasks_table.c
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    t.id.in_(ids), t.state.in_([TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD])
                )
            ).scalar_one()
        )


def _summarize(app: App, console: Console, ids: dict[str, int], elapsed: float) -> int:
    infos = [app.get_task(task_id) for task_id in ids]
    with Session(app.engine) as s:
        rows = s.exec(select(DemoResult).where(sa.column("task_id").in_(list(ids)))).all()
    by_task = {r.task_id: r for r in rows}
    latencies = sorted(
        (i.finished_at - i.created_at).total_seconds() * 1000 for i in infos if i.finished_at is not None
    )
    checks = {
        "every task SUCCEEDED": all(i.state == TaskState.SUCCEEDED for i in infos),
        "one business row per task": len(rows) == len(ids) == len(by_task),
        "results correct": all(by_task[t].value == _collatz_steps(n) for t, n in ids.items() if t in by_task),
        "flaky tasks retried once": all(len(i.attempts) == (2 if ids[i.id] % 10 == 7 else 1) for i in infos),
    }
    table = Table(title=f"demo summary · {len(ids)} tasks in {elapsed:.1f} s")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("succeeded", str(sum(i.state == TaskState.SUCCEEDED for i in infos)))
    table.add_row("attempts", str(sum(len(i.attempts) for i in infos)))
    table.add_row("retried after failure", str(sum(any(a.outcome == "failed" for a in i.attempts) for i in infos)))
    if latencies:
        table.add_row("latency p50 (ms)", f"{statistics.median(latencies):.1f}")
        table.add_row("latency p99 (ms)", f"{latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]:.1f}")
    for name, ok in checks.items():
        table.add_row(name, "[green]ok[/]" if ok else "[red]FAILED[/]")
    console.print(table)
    return 0 if all(checks.values()) else 1
