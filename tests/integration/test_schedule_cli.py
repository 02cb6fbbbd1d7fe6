"""The scheduler role and ``durable-tasks schedules`` against real servers."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from durable_tasks import App
from durable_tasks.cli import cli
from durable_tasks.records import tasks_table
from tests.helpers import assert_running, block_until, cli_process

APP = "tests.apps.periodic_app:app"


@pytest.fixture
def env(cli_app_env: Callable[..., dict[str, str]]) -> Iterator[dict[str, str]]:
    sys.modules.pop("tests.apps.periodic_app", None)
    yield cli_app_env()
    sys.modules.pop("tests.apps.periodic_app", None)


def periodic_app() -> App:
    from tests.apps.periodic_app import app

    app.create_all()
    return app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def ticks(app: App) -> int:
    t = tasks_table.c
    with app.engine.connect() as conn:
        query = sa.select(sa.func.count()).where(t.namespace == app.settings.namespace, t.name == "periodic.tick")
        return int(conn.execute(query).scalar_one())


def test_schedules_are_listed_paused_and_resumed_without_a_deploy(env: dict[str, str]) -> None:
    periodic_app()
    code, out = invoke("schedules", "list", "--app", APP)
    assert code == 0, out
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}  # plain columns when piped
    assert {"every-second", "nightly"} <= set(rows)
    assert "cron 30 2 * * * (Europe/Paris)" in rows["nightly"]
    assert "active" in rows["every-second"]
    code, out = invoke("schedules", "list", APP, "--json")
    assert code == 0, out
    assert {json.loads(line)["name"]: json.loads(line)["state"] for line in out.splitlines()}["nightly"] == "active"
    code, out = invoke("schedules", "pause", "every-second", "--app", APP)
    assert code == 0, out
    assert "paused" in next(line for line in out.splitlines() if "every-second" in line)
    code, out = invoke("schedules", "resume", "every-second", "--app", APP)
    assert code == 0, out
    assert "active" in next(line for line in out.splitlines() if "every-second" in line)
    code, out = invoke("schedules", "pause", "no-such-schedule", "--app", APP)
    assert code == 2
    assert "no schedule named 'no-such-schedule'" in out
    code, out = invoke("status", APP)
    assert code == 0, out
    assert "nightly" in out
    assert "next tick" in out


@pytest.mark.slow
def test_the_scheduler_role_submits_ticks_until_sigint(env: dict[str, str]) -> None:
    app = periodic_app()
    with cli_process("scheduler", APP) as proc:

        def ticked_twice() -> bool:
            assert_running(proc)
            return ticks(app) >= 2

        block_until(ticked_twice, timeout=60, what="the scheduler to submit two ticks")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    app.engine.dispose()
