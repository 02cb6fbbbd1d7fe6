"""``durable-tasks limits`` and the limits in ``status``, against real servers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import pytest
from typer.testing import CliRunner

from durable_tasks.cli import cli

APP = "tests.apps.flow_app:app"


@pytest.fixture
def env(cli_app_env: Callable[..., dict[str, str]]) -> Iterator[dict[str, str]]:
    sys.modules.pop("tests.apps.flow_app", None)
    yield cli_app_env()
    sys.modules.pop("tests.apps.flow_app", None)


def limit_rows(out: str) -> dict[str, list[str]]:
    # plain columns when piped: limit, rate, burst, concurrency, set at run time (yes/no)
    rows = [line.split() for line in out.splitlines()]
    return {row[0]: row[1:] for row in rows if len(row) == 5 and row[-1] in ("yes", "no")}


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def test_limits_are_listed_changed_and_cleared_without_a_deploy(env: dict[str, str]) -> None:
    from tests.apps.flow_app import app

    app.create_all()
    code, out = invoke("status", APP)
    assert code == 0, out
    assert limit_rows(out)["openai"] == ["3000/m", "10", "-", "no"]
    assert limit_rows(out)["task:flow.call"] == ["-", "1", "2", "no"]
    code, out = invoke("limits", "set", "openai", "--rate", "600/m", "--app", APP)
    assert code == 0, out
    assert limit_rows(out)["openai"] == ["600/m", "10", "-", "yes"]
    code, out = invoke("limits", "clear", "openai", "--app", APP)
    assert code == 0, out
    code, out = invoke("limits", "list", "--app", APP)
    assert limit_rows(out)["openai"] == ["3000/m", "10", "-", "no"]
    code, out = invoke("limits", "list", APP, "--json")
    assert {"name": "openai", "rate": "3000/m", "burst": 10, "concurrency": None, "changed": False} in [
        json.loads(line) for line in out.splitlines()
    ]
    code, out = invoke("limits", "set", "nope", "--rate", "1/s", "--app", APP)
    assert code != 0
    assert "no limit named 'nope'" in out
