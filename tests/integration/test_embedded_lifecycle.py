"""The embedded default is one place and cleans up after itself: real `durable-tasks` processes
on an app module with no URLs, started from other directories and stopped by pid (Ctrl-C,
SIGTERM, SIGKILL); every wait is on a condition with a deadline."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_tasks.valkey_keeper import is_valkey, pid_alive, ping
from tests.helpers import block_until

pytestmark = pytest.mark.slow

APP_MODULE = """
from durable_tasks import App, TaskContext

app = App(namespace="life")  # no URLs, no data_dir: the embedded default beside this file


@app.task(name="life.shout")
def shout(ctx: TaskContext[str], text: str) -> str:
    return text.upper()
"""

PRODUCER = """
import sys
from sqlmodel import Session
from lifeapp import app, shout
with Session(app.engine) as session:
    shout.submit(session, sys.argv[1])
    session.commit()
"""

FAST = {"DT_POLL_INTERVAL": "0.1", "DT_READ_BLOCK": "0.1", "DT_REAPER_INTERVAL": "0.5"}


class Project:
    """An app module in ``home``, run from ``elsewhere`` (a different working directory)."""

    def __init__(self, root: Path) -> None:
        self.home = root / "project"
        self.elsewhere = root / "elsewhere"
        self.home.mkdir()
        self.elsewhere.mkdir()
        (self.home / "lifeapp.py").write_text(APP_MODULE)
        self.data_dir = self.home / ".durable_tasks"
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
        return env | FAST | {"PYTHONPATH": str(self.home)}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durable_tasks", *args],
            cwd=self.elsewhere,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start_run(self) -> subprocess.Popen[bytes]:
        with (self.home / "run.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "durable_tasks", "run", "lifeapp:app"],
                cwd=self.elsewhere,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        block_until(lambda: self.users().get(proc.pid), timeout=60, what="the runtime to use the embedded Valkey")
        return proc

    def submit(self, text: str, cwd: Path) -> None:
        subprocess.run([sys.executable, "-c", PRODUCER, text], cwd=cwd, env=self.env(), check=True, timeout=120)

    def state(self) -> dict[str, object]:
        try:
            loaded: dict[str, object] = json.loads((self.data_dir / "valkey.json").read_text())
        except (OSError, ValueError):
            return {}
        return loaded

    def users(self) -> dict[int, object]:
        return {int(pid): start for pid, start in dict(self.state().get("users", {})).items()}  # type: ignore[call-overload]

    def server(self) -> int:
        return int(str(self.state()["server_pid"]))

    def keeper(self) -> int:
        return int(str(self.state()["owner_pid"]))

    def task_states(self) -> dict[str, str]:
        with sqlite3.connect(self.data_dir / "durable_tasks.sqlite3") as conn:
            return dict(conn.execute("SELECT payload, state FROM dt_tasks").fetchall())


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    project = Project(tmp_path)
    init = project.cli("init-db", "lifeapp:app")
    assert init.returncode == 0, init.stdout + init.stderr
    yield project
    for proc in project.procs:  # only the processes this test started, by pid
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    state = project.state()
    for key in ("server_pid", "owner_pid"):
        pid = int(state.get(key, 0))  # type: ignore[call-overload]
        if pid and pid_alive(pid) and (key == "owner_pid" or is_valkey(pid)):
            os.kill(pid, signal.SIGKILL)


def test_data_dir_is_beside_the_app_module_whatever_the_working_directory(project: Project) -> None:
    run = project.start_run()
    project.submit("from elsewhere", project.elsewhere)
    project.submit("from the project", project.home)
    block_until(
        lambda: set(project.task_states().values()) == {"SUCCEEDED"} and len(project.task_states()) == 2,
        timeout=60,
        what="both tasks to succeed",
    )
    assert set(project.task_states()) == {'"from elsewhere"', '"from the project"'}
    assert not (project.elsewhere / ".durable_tasks").exists(), "a second SQLite file or Valkey was made"
    assert run.poll() is None


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_the_server_stops_when_the_last_process_that_uses_it_stops(project: Project, how: signal.Signals) -> None:
    first, second = project.start_run(), project.start_run()
    server, keeper = project.server(), project.keeper()
    assert set(project.users()) == {first.pid, second.pid}

    first.send_signal(how)
    first.wait(timeout=60)
    block_until(lambda: set(project.users()) == {second.pid}, timeout=30, what="the first process to be dropped")
    assert pid_alive(server), "the server must stay while a process uses it"
    assert ping(str(project.state()["socket"]))

    second.send_signal(how)
    second.wait(timeout=60)
    block_until(lambda: not pid_alive(server), timeout=30, what="the embedded Valkey to stop")
    block_until(lambda: not pid_alive(keeper), timeout=30, what="its keeper to exit")
    assert not (project.data_dir / "valkey.json").exists()


def test_a_server_that_dies_under_the_runtime_is_restarted(project: Project) -> None:
    run = project.start_run()
    project.submit("before", project.elsewhere)
    block_until(lambda: project.task_states().get('"before"') == "SUCCEEDED", timeout=60, what="the first task")
    old = project.server()

    os.kill(old, signal.SIGKILL)
    block_until(lambda: project.state().get("server_pid") not in (None, old), timeout=30, what="a new server")
    sock = str(project.state()["socket"])
    block_until(lambda: ping(sock), timeout=30, what="the new server to answer")

    project.submit("after", project.elsewhere)
    block_until(lambda: project.task_states().get('"after"') == "SUCCEEDED", timeout=60, what="a task after it")
    assert run.poll() is None, "the runtime kept running"
    assert f"valkey pid {old} exited" in (project.data_dir / "keeper.log").read_text()
