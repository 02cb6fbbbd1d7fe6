"""The durable-tasks command against real servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from durable_tasks import App, TaskState
from durable_tasks.cli import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli_env(cli_app_env: Callable[..., dict[str, str]]) -> Iterator[dict[str, str]]:
    yield cli_app_env(DT_POLL_INTERVAL="0.1", DT_READ_BLOCK="0.1", DT_REAPER_INTERVAL="0.5")
    sys.modules.pop("tests.apps.cli_app", None)


def fresh_app() -> App:
    from tests.apps.cli_app import app

    return app


def test_init_db_then_status_prints_the_queue_table(cli_env: dict[str, str]) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["init-db", "tests.apps.cli_app:app"])
    assert result.exit_code == 0, result.output
    app = fresh_app()
    with Session(app.engine) as s:
        app.submit(s, "cli.nap", {"seconds": 0})
        s.commit()
    result = runner.invoke(cli, ["status", "tests.apps.cli_app:app"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "outbox_backlog" in result.output
    row = next(line for line in result.output.splitlines() if line.strip("│ ").startswith("cli"))
    assert row.split("│")[2].strip() == "1"  # one row waiting in the outbox


def test_a_bad_app_spec_is_a_clear_error(cli_env: dict[str, str]) -> None:
    result = CliRunner().invoke(cli, ["status", "no_colon_here"])
    assert result.exit_code != 0
    assert "module:attribute" in result.output


@pytest.mark.parametrize("wait", ["0", "1.5"])
def test_unreachable_redis_exits_with_a_typed_error_once_the_startup_wait_is_over(
    cli_env: dict[str, str], wait: str
) -> None:
    env = {**os.environ, "DT_REDIS_URL": "redis://127.0.0.1:1/0", "DT_STARTUP_WAIT": wait}
    proc = subprocess.run(
        [sys.executable, "-m", "durable_tasks", "worker", "tests.apps.cli_app:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    output = proc.stdout + proc.stderr
    assert "cannot reach Redis" in output
    retries = output.count("retrying for up to")
    assert retries == 0 if wait == "0" else retries >= 2  # it kept trying for the whole wait


@pytest.mark.slow
def test_run_processes_tasks_and_stops_gracefully_on_sigint(cli_env: dict[str, str]) -> None:
    app = fresh_app()
    app.create_all()
    with Session(app.engine) as s:
        quick = app.submit(s, "cli.nap", {"seconds": 0}).id
        s.commit()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_tasks", "run", "tests.apps.cli_app:app"],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while app.get_task(quick).state != TaskState.SUCCEEDED:
            assert time.monotonic() < deadline, "run did not process the task"
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        # A task in flight when Ctrl-C arrives finishes before the process exits.
        with Session(app.engine) as s:
            slow = app.submit(s, "cli.nap", {"seconds": 1.5}).id
            s.commit()
        while app.get_task(slow).state != TaskState.RUNNING:
            assert time.monotonic() < deadline, "the slow task never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert app.get_task(slow).state == TaskState.SUCCEEDED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
