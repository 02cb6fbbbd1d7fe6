"""The durable-tasks command against real servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
import typer.main
from sqlmodel import Session
from typer.core import TyperGroup
from typer.testing import CliRunner

from durable_tasks import App, TaskState
from durable_tasks.cli import cli
from tests.helpers import assert_running, block_until, cli_process
from tests.servers import private_redis

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
    header, row = (line.split() for line in result.output.splitlines()[1:3])  # plain columns when piped
    assert dict(zip(header, row, strict=True))["outbox_backlog"] == "1"  # one row waiting in the outbox


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


def test_every_command_that_loads_an_app_takes_it_first_or_by_option() -> None:
    def leaves(group: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        if isinstance(group, TyperGroup):
            for name, sub in sorted(group.commands.items()):
                yield from leaves(sub, (*path, name))
        else:
            yield path, group

    checked = 0
    for path, command in leaves(typer.main.get_command(cli), ()):
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        if not any(p.name == "app" for p in command.params):
            continue
        assert arguments[0].name == "app", f"`{' '.join(path)}`: APP is not its first argument"
        options = [opt for p in command.params if p.param_type_name == "option" for opt in p.opts]
        assert "--app" in options, f"`{' '.join(path)}` takes APP but not --app"
        option = next(p for p in command.params if "--app" in getattr(p, "opts", ()))
        assert option.envvar == "DT_APP", f"`{' '.join(path)}`: --app does not read DT_APP"
        checked += 1
    assert checked >= 20


#: The commands that only read, each of which takes --json.
READ_COMMANDS = [
    ("status",),
    ("tasks", "list"),
    ("tasks", "show"),
    ("dlq", "list"),
    ("dlq", "show"),
    ("schedules", "list"),
    ("approvals", "list"),
    ("limits", "list"),
    ("doctor",),
]


@pytest.mark.parametrize("path", READ_COMMANDS, ids=" ".join)
def test_every_read_command_takes_json(path: tuple[str, ...]) -> None:
    command: Any = typer.main.get_command(cli)
    for name in path:
        command = command.commands[name]
    assert "--json" in [opt for p in command.params for opt in getattr(p, "opts", ())]


def run_cli(*argv: str, env: dict[str, str]) -> tuple[int, list[str]]:
    """The command in its own process; its exit code and non-blank output lines."""
    proc = subprocess.run(
        [sys.executable, "-m", "durable_tasks", *argv],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80", **env},
        capture_output=True,
        text=True,
        timeout=90,
    )
    return proc.returncode, [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


@pytest.mark.parametrize("command", ["run", "worker", "web", "doctor", "status", "init-db"])
@pytest.mark.parametrize("backend", ["postgres", "mysql"])
def test_a_database_that_does_not_exist_fails_each_command_at_once_in_one_line(
    request: pytest.FixtureRequest, redis_url: str, namespace: str, tmp_path: Path, backend: str, command: str
) -> None:
    server = sa.make_url(request.getfixturevalue(f"{backend}_url"))
    missing = server.set(database="dt_no_such_database").render_as_string(hide_password=False)
    env = {"DT_DATABASE_URL": missing, "DT_REDIS_URL": redis_url, "DT_NAMESPACE": namespace}
    # A long startup wait: waiting cannot create the database, so nobody waits it out.
    env |= {"DT_DATA_DIR": str(tmp_path), "DT_STARTUP_WAIT": "600"}
    code, lines = run_cli(command, "tests.apps.cli_app:app", env=env)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert "dt_no_such_database" in lines[0]
    assert "does not exist" in lines[0]


def test_a_refused_redis_login_fails_at_once_in_one_line(
    postgres_url: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    server = urlsplit(redis_url)
    where = (
        server.path if server.scheme == "unix" else f"{server.hostname}:{server.port}/0"
    )  # the embedded Valkey's socket
    env = {"DT_DATABASE_URL": postgres_url, "DT_NAMESPACE": namespace, "DT_DATA_DIR": str(tmp_path)}
    env |= {"DT_REDIS_URL": f"{server.scheme}://dt:not-the-password@{where}", "DT_STARTUP_WAIT": "600"}
    code, lines = run_cli("worker", "tests.apps.cli_app:app", env=env)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert "refused the login" in lines[0]
    assert "not-the-password" not in lines[0]


def test_a_postgres_scheme_url_is_read_as_postgresql(
    postgres_url: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    url = sa.make_url(postgres_url)
    heroku_style = url.set(drivername="postgres").render_as_string(hide_password=False)
    assert heroku_style.startswith("postgres://")
    env = {"DT_DATABASE_URL": heroku_style, "DT_REDIS_URL": redis_url, "DT_NAMESPACE": namespace}
    env["DT_DATA_DIR"] = str(tmp_path)
    for command in ("init-db", "status"):
        code, lines = run_cli(command, "tests.apps.cli_app:app", env=env)
        assert code == 0, lines


@pytest.mark.parametrize("command", ["web", "run", "status", "prune"])
def test_an_empty_database_fails_each_command_in_one_line_that_names_init_db(
    redis_url: str, namespace: str, tmp_path: Path, command: str
) -> None:
    env = {"DT_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}", "DT_REDIS_URL": redis_url}
    env |= {"DT_NAMESPACE": namespace, "DT_DATA_DIR": str(tmp_path)}
    code, lines = run_cli(*command.split(), "tests.apps.cli_app:app", env=env)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert "durable-tasks init-db" in lines[0]


def test_worker_prints_a_banner_with_masked_urls_and_takes_queues_and_concurrency(
    postgres_url: str, namespace: str, tmp_path: Path
) -> None:
    secret = "Banner-pw-31c7"
    database = sa.make_url(postgres_url).set(password=secret).render_as_string(hide_password=False)
    with private_redis(tmp_path / "redis", "--requirepass", secret) as server:
        env = {**os.environ, "DT_DATABASE_URL": database, "DT_NAMESPACE": namespace, "DT_DATA_DIR": str(tmp_path)}
        env["DT_REDIS_URL"] = f"redis://:{secret}@127.0.0.1:{server.port}/0"
        App(database, env["DT_REDIS_URL"], namespace).create_all()
        args = ("-Q", "cli", "-c", "3", "--handler-threads", "2")
        with cli_process("worker", "tests.apps.cli_app:app", *args, env=env) as proc:
            assert proc.stdout is not None
            banner: list[str] = []
            while not any("concurrency" in line for line in banner):
                line = proc.stdout.readline()
                assert line, f"the worker ended before its banner: {banner}"
                banner.append(line)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
    text = "".join(banner)
    assert secret not in text
    assert "postgres:***@" in text
    assert f"redis://:***@127.0.0.1:{server.port}/0" in text
    assert f"namespace    {namespace}" in text
    assert "queues       cli" in text
    assert "cli.nap (cli)" in text
    assert "concurrency  3 (shutdown grace 30 s; payloads over 64 KiB 128 MiB; sync-handler threads 2)" in text


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["-Q", "nowhere"], "no registered task uses queue nowhere"),
        (["-c", "0"], "concurrency"),
        (["--handler-threads", "0"], "handler_threads"),
    ],
)
def test_worker_refuses_a_queue_no_task_uses_and_a_bad_concurrency_in_one_line(
    cli_env: dict[str, str], option: list[str], says: str
) -> None:
    code, lines = run_cli("worker", "tests.apps.cli_app:app", *option, env=cli_env)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert says in lines[0]


@pytest.mark.slow
def test_run_processes_tasks_and_stops_gracefully_on_sigint(cli_env: dict[str, str]) -> None:
    app = fresh_app()
    app.create_all()
    with Session(app.engine) as s:
        quick = app.submit(s, "cli.nap", {"seconds": 0}).id
        s.commit()
    with cli_process("run", "tests.apps.cli_app:app") as proc:

        def reached(task_id: str, state: TaskState) -> Callable[[], bool]:
            def check() -> bool:
                assert_running(proc)
                return app.get_task(task_id).state == state

            return check

        block_until(reached(quick, TaskState.SUCCEEDED), timeout=60, what="run to process the task")
        # A task in flight when Ctrl-C arrives finishes before the process exits.
        with Session(app.engine) as s:
            slow = app.submit(s, "cli.nap", {"seconds": 1.5}).id
            s.commit()
        block_until(reached(slow, TaskState.RUNNING), timeout=60, what="the slow task to start")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert app.get_task(slow).state == TaskState.SUCCEEDED
