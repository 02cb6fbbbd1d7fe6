"""The durable-agent example (pydantic-ai): the scripted run, and a run whose process is SIGKILLed
mid-tool and resumed without a second model call."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from anyio.abc import Process
from sqlmodel import Session

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from durable_tasks import App, TaskInfo, TaskState
from examples.agent.app import AGENT_NAME, CALL_LOG_ENV, EXPECTED_ANSWER, QUESTION, SLOW_SECONDS_ENV, Assistant, build
from examples.agent.run import main as run_main
from tests.helpers import child_env_of, run_tree, run_until_quiet

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 90.0


@pytest.fixture(autouse=True)
def _no_agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOW_SECONDS_ENV, raising=False)
    monkeypatch.delenv(CALL_LOG_ENV, raising=False)


@pytest.fixture
async def assistant(make_app: Callable[..., App]) -> AsyncIterator[Assistant]:
    probe = make_app()  # the test's servers and fast timings, as settings
    built = build(settings=probe.settings)
    built.app.create_all()
    yield built
    await built.app.aclose()


def ask(assistant: Assistant, question: str = QUESTION) -> str:
    with Session(assistant.app.engine) as session:
        task_id = assistant.ask.submit(session, question).id
        session.commit()
    return task_id


def tool_tasks(app: App, run_id: str) -> dict[str, TaskInfo]:
    """The run's tool tasks by tool call id (the slot names it: ``child:tool:<tool>:<call id>:…``)."""
    with app.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, parent_slot FROM dt_tasks WHERE parent_id = :p"), {"p": run_id}).all()
    return {row.parent_slot.split(":")[3]: app.get_task(row.id) for row in rows}


def outcomes(task: TaskInfo) -> list[str | None]:
    return [a.outcome for a in task.attempts]


# -- building --------------------------------------------------------------------------------


def test_build_reads_dt_settings_and_registers_the_run_task(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DT_NAMESPACE", "agent-env")
    monkeypatch.setenv("DT_DATABASE_URL", f"sqlite:///{tmp_path / 'a.sqlite3'}")
    built = build()  # connects to nothing yet
    settings = built.app.settings
    assert (settings.namespace, settings.database_url) == ("agent-env", f"sqlite:///{tmp_path / 'a.sqlite3'}")
    assert built.ask.name == f"agent.{AGENT_NAME}"
    assert built.app.registry[f"pydantic_ai.{AGENT_NAME}.tool.flaky_search"].max_attempts == 3
    assert build(namespace="agent-kw", redis_url="redis://127.0.0.1:1").app.settings.namespace == "agent-kw"


def test_the_example_imports_only_the_public_api() -> None:
    public = {"durable_tasks", "durable_tasks.integrations", "durable_tasks.integrations.pydantic_ai"}
    for path in (REPO_ROOT / "examples" / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module in public or not node.module.startswith("durable_tasks"), path
            if isinstance(node, ast.Import):
                assert all(a.name in public or not a.name.startswith("durable_tasks") for a in node.names), path


def test_resuming_an_unknown_task_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DT_DATABASE_URL", f"sqlite:///{tmp_path / 'a.sqlite3'}")
    monkeypatch.setenv("DT_REDIS_URL", "redis://127.0.0.1:1")  # never reached
    assert run_main(["--resume", "no-such-task"]) == 2
    assert "no task 'no-such-task'" in capsys.readouterr().err


# -- the scripted run (SQLite and PostgreSQL, real Redis) ---------------------------------------


async def test_the_scripted_run_answers_from_every_tool_result(
    assistant: Assistant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call_log = tmp_path / "calls.jsonl"
    monkeypatch.setenv(CALL_LOG_ENV, str(call_log))
    run_id = ask(assistant)
    await run_until_quiet(assistant.app)

    run = assistant.app.get_task(run_id)
    assert (run.state, run.result) == (TaskState.SUCCEEDED, EXPECTED_ANSWER), await run_tree(assistant.app, run_id)
    assert [json.loads(line)["turn"] for line in call_log.read_text().splitlines()] == [0, 1, 2]
    by_call = tool_tasks(assistant.app, run_id)
    assert sorted(by_call) == ["call_calc", "call_kv", "call_report", "call_search"]
    assert all(t.state == TaskState.SUCCEEDED for t in by_call.values())
    assert outcomes(by_call["call_search"]) == ["failed", "failed", "succeeded"]  # retried by the runtime
    assert [a.error_type for a in by_call["call_search"].attempts[:2]] == ["ConnectionError", "ConnectionError"]


# -- a real process SIGKILLed in the middle of a run ---------------------------------------------


def child_env(app: App, tmp_path: Path, call_log: Path, *, slow_seconds: float) -> dict[str, str]:
    return child_env_of(app, tmp_path / "child-data") | {
        SLOW_SECONDS_ENV: str(slow_seconds),
        CALL_LOG_ENV: str(call_log),
    }


async def spawn(args: list[str], env: dict[str, str], log: Path, children: list[Process]) -> Process:
    with log.open("wb") as out:
        child = await anyio.open_process(
            [sys.executable, "-m", "examples.agent.run", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    children.append(child)
    return child


async def read(log: Path) -> str:
    return await anyio.Path(log).read_text() if await anyio.Path(log).exists() else ""


async def wait_for(what: str, check: Callable[[], Any], child: Process, log: Path) -> Any:
    """Poll ``check`` until it returns something truthy (at most WAIT_S); fail if ``child`` exits."""
    with anyio.move_on_after(WAIT_S):
        while True:
            found = await anyio.to_thread.run_sync(check)
            if found:
                return found
            if child.returncode is not None:
                pytest.fail(f"{what}: the run exited early ({child.returncode}):\n{(await read(log))[-4000:]}")
            await anyio.sleep(0.05)
    pytest.fail(f"{what}: not within {WAIT_S:g}s:\n{(await read(log))[-4000:]}")


@pytest.mark.slow
@pytest.mark.timeout(300)  # two processes importing pydantic-ai, a 1 s lease, a 30 s budget per wait
async def test_a_run_killed_mid_tool_resumes_without_calling_the_model_again(
    assistant: Assistant, tmp_path: Path
) -> None:
    app = assistant.app  # this process only reads the records
    call_log = tmp_path / "model-calls.jsonl"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    children: list[Process] = []
    try:
        first = await spawn([QUESTION], child_env(app, tmp_path, call_log, slow_seconds=30), first_log, children)

        def task_id_line() -> str | None:
            lines = first_log.read_text().splitlines() if first_log.exists() else []
            return next((line.removeprefix("task_id=") for line in lines if line.startswith("task_id=")), None)

        run_id: str = await wait_for("task_id", task_id_line, first, first_log)

        def slow_report_running() -> TaskInfo | None:
            report = tool_tasks(app, run_id).get("call_report")
            return report if report is not None and report.state == TaskState.RUNNING else None

        running: TaskInfo = await wait_for("slow_report RUNNING", slow_report_running, first, first_log)
        assert running.attempts[-1].worker_id.split(":")[1] == str(first.pid)
        assert app.get_task(run_id).state == TaskState.WAITING  # the run holds no slot meanwhile
        os.kill(first.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            assert await first.wait() == -signal.SIGKILL

        second = await spawn(
            ["--resume", run_id], child_env(app, tmp_path, call_log, slow_seconds=0), second_log, children
        )
        with anyio.move_on_after(WAIT_S):
            await second.wait()
        output = await read(second_log)
        assert second.returncode == 0, output[-4000:]
    finally:
        for child in children:  # only the processes this test started
            if child.returncode is None:
                child.kill()
                await child.wait()
            await child.aclose()

    assert f"task_id={run_id}" in output
    assert f"answer: {EXPECTED_ANSWER}" in output
    assert app.get_task(run_id).result == EXPECTED_ANSWER
    by_call = tool_tasks(app, run_id)
    for call_id, task in by_call.items():
        assert task.state == TaskState.SUCCEEDED, (call_id, task.error_type, task.error_message)
        assert outcomes(task).count("succeeded") == 1, (call_id, outcomes(task))
    report = by_call["call_report"]
    assert outcomes(report) == ["lost", "succeeded"]
    assert report.attempts[1].worker_id.split(":")[1] == str(second.pid)
    calls = [json.loads(line) for line in call_log.read_text().splitlines()]
    assert calls == [{"turn": 0}, {"turn": 1}, {"turn": 2}]  # no turn was sent to the model twice
