"""A real worker process is SIGKILLed mid-task; another worker finishes the task, and the
business row written by the on-commit hook exists exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, TaskState
from durable_tasks.store.engine import read_only
from durable_tasks.transport.keys import CONSUMER_GROUP
from tests.apps.crash_app import CrashJob, crash_verdicts_table, create_business_tables, register
from tests.helpers import outlive_lease, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_CODE = "import anyio; from tests.apps.crash_app import build_app; anyio.run(build_app().work)"
MARKER_TIMEOUT_S = 60.0


def _child_env(app: App, data_dir: Path) -> dict[str, str]:
    s = app.settings
    assert s.database_url is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
    env |= {
        "DT_DATABASE_URL": s.database_url,
        "DT_REDIS_URL": app.redis_url,
        "DT_NAMESPACE": s.namespace,
        "DT_DATA_DIR": str(data_dir),
        # ISO 8601 durations (parsed by every version of the settings model).
        "DT_LEASE_TIMEOUT": "PT1S",
        "DT_HEARTBEAT_INTERVAL": "PT0.3S",
        "DT_READ_BLOCK": "PT0.1S",
        "CRASH_APP_HOLD_SECONDS": "30",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return env


def _verdicts(app: App, task_id: str) -> list[tuple[str, int, int]]:
    c = crash_verdicts_table.c
    with read_only(app.engine).connect() as conn:
        rows = conn.execute(sa.select(c.verdict, c.written_by_pid, c.attempt).where(c.task_id == task_id)).all()
    return [(r.verdict, r.written_by_pid, r.attempt) for r in rows]


async def _markers(marker_dir: Path) -> list[str]:
    return sorted([p.name async for p in anyio.Path(marker_dir).iterdir()])


async def _tail(path: Path) -> str:
    text = await anyio.Path(path).read_text() if await anyio.Path(path).exists() else ""
    return text[-4000:]


async def test_sigkilled_worker_task_is_finished_by_another_worker_and_written_once(
    make_app: Callable[..., App], tmp_path: Path
) -> None:
    app = make_app(clock=FrozenClock())
    try:
        judge = register(app, hold_seconds=0)  # the in-process worker finishes at once
        create_business_tables(app.engine)
        marker_dir = tmp_path / "markers"
        marker_dir.mkdir()
        with Session(app.engine) as s:
            task_id = judge.submit(s, CrashJob(marker_dir=str(marker_dir))).id
            s.commit()
        assert await app.dispatch_once() == 1

        log = tmp_path / "child.log"
        with log.open("wb") as log_file:
            child = await anyio.open_process(
                [sys.executable, "-c", CHILD_CODE],
                cwd=REPO_ROOT,
                env=_child_env(app, tmp_path / "child-data"),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            # Wait until the child is inside the handler (it claimed the task, then wrote the marker).
            async def child_in_handler() -> bool:
                if child.returncode is not None:
                    pytest.fail(f"worker exited early ({child.returncode}):\n{await _tail(log)}")
                return bool(await _markers(marker_dir))

            await wait_until(child_in_handler, timeout=MARKER_TIMEOUT_S, what="the child worker to run the handler")
            started = await _markers(marker_dir)
            assert started == [f"attempt-1-pid-{child.pid}"], await _tail(log)
            running = app.get_task(task_id)
            assert running.state == TaskState.RUNNING
            assert running.attempts[0].worker_id.split(":")[1] == str(child.pid)

            os.kill(child.pid, signal.SIGKILL)
            assert await child.wait() == -signal.SIGKILL
        finally:
            if child.returncode is None:  # only the process this test started
                child.kill()
                await child.wait()
            await child.aclose()

        # Heartbeats stopped with the process: time passes (the clock, the entry's idle time) past the lease.
        assert await outlive_lease(app) == 1
        report = await app.reap_once()
        assert report.redelivered == 1, report
        lost = app.get_task(task_id)
        assert lost.state == TaskState.PENDING
        assert (lost.delivery, lost.reclaims) == (1, 1)
        assert _verdicts(app, task_id) == []  # the killed attempt committed nothing

        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=30)) == 1

        info = app.get_task(task_id)
        assert info.state == TaskState.SUCCEEDED, (info.error_type, info.error_message)
        assert info.result == "accepted (attempt 2)"
        assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost"), (2, "succeeded")]
        assert info.attempts[0].worker_id.split(":")[1] == str(child.pid)
        assert info.attempts[1].worker_id.split(":")[1] == str(os.getpid())
        # The body ran twice (at-least-once) ...
        assert await _markers(marker_dir) == sorted([f"attempt-1-pid-{child.pid}", f"attempt-2-pid-{os.getpid()}"])
        # ... but the business row was written once, by the surviving worker.
        assert _verdicts(app, task_id) == [("accepted (attempt 2)", os.getpid(), 2)]
        summary = await app.runtime.transport().client.xpending(
            app.runtime.transport().keys("crash").stream, CONSUMER_GROUP
        )
        assert summary["pending"] == 0
    finally:
        await app.aclose()
