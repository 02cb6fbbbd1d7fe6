"""The durable-agent example: the scripted run, the OpenAI adapter over recorded responses,
and a run whose process is SIGKILLed mid-tool and resumed without a second model call."""

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

from durable_tasks import App, TaskInfo, TaskState
from durable_tasks.agents import Agent, ChatModel, ModelTurn, ScriptedModel, ToolCall
from examples.agent.app import (
    AGENT_NAME,
    CALL_LOG_ENV,
    EXPECTED_ANSWER,
    QUESTION,
    SLOW_SECONDS_ENV,
    build,
    install_agent,
    scripted_model,
)
from examples.agent.openai_adapter import INVALID_JSON_KEY, OpenAIChatModel, ReplayCompletions
from examples.agent.run import main as run_main
from tests.helpers import run_until_quiet

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "examples" / "agent" / "fixtures" / "openai_calculator.json"
TOOL_PREFIX = f"agent.{AGENT_NAME}.tool."
TURN_TASK = f"agent.{AGENT_NAME}.turn"
WAIT_S = 60.0


@pytest.fixture(autouse=True)
def _no_agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOW_SECONDS_ENV, raising=False)
    monkeypatch.delenv(CALL_LOG_ENV, raising=False)


@pytest.fixture
async def make_agent(make_app: Callable[..., App]) -> AsyncIterator[Callable[..., tuple[App, Agent]]]:
    apps: list[App] = []

    def make(model: ChatModel | None = None) -> tuple[App, Agent]:
        app = make_app()
        agent = install_agent(app, model)
        apps.append(app)
        return app, agent

    yield make
    for app in apps:
        await app.aclose()


def start(agent: Agent, question: str = QUESTION) -> str:
    with Session(agent.app.engine) as s:
        run_id = agent.start(s, question)
        s.commit()
    return run_id


def tasks(app: App) -> list[TaskInfo]:
    """Every task of the app's namespace, oldest first (there is no public "tasks of a run")."""
    with app.engine.connect() as conn:
        ids = conn.execute(
            sa.text("SELECT id FROM dt_tasks WHERE namespace = :ns ORDER BY created_at, id"),
            {"ns": app.settings.namespace},
        ).scalars()
        found = list(ids)
    return [app.get_task(task_id) for task_id in found]


def tool_tasks(app: App) -> dict[str, TaskInfo]:
    """Tool tasks by tool call id, as the task's payload names it."""
    return {t.payload["call_id"]: t for t in tasks(app) if t.name.startswith(TOOL_PREFIX)}


def outcomes(task: TaskInfo) -> list[str | None]:
    return [a.outcome for a in task.attempts]


# -- building --------------------------------------------------------------------------------


def test_build_reads_dt_settings_and_registers_the_tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DT_NAMESPACE", "agent-env")
    monkeypatch.setenv("DT_DATABASE_URL", f"sqlite:///{tmp_path / 'a.sqlite3'}")
    app, agent = build()  # connects to nothing yet
    assert (app.settings.namespace, app.settings.database_url) == ("agent-env", f"sqlite:///{tmp_path / 'a.sqlite3'}")
    assert list(agent.tools) == ["calculator", "kv_lookup", "flaky_search", "slow_report"]
    assert app.registry[f"{TOOL_PREFIX}flaky_search"].max_attempts == 3
    explicit, _ = build(namespace="agent-kw", redis_url="redis://127.0.0.1:1")
    assert explicit.settings.namespace == "agent-kw"


def test_the_example_imports_only_the_public_api() -> None:
    public = {"durable_tasks", "durable_tasks.agents"}
    for path in (REPO_ROOT / "examples" / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module in public or not node.module.startswith("durable_tasks"), path
            if isinstance(node, ast.Import):
                assert all(a.name in public or not a.name.startswith("durable_tasks") for a in node.names), path


def test_resuming_an_unknown_run_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DT_DATABASE_URL", f"sqlite:///{tmp_path / 'a.sqlite3'}")
    monkeypatch.setenv("DT_REDIS_URL", "redis://127.0.0.1:1")  # never reached
    assert run_main(["--resume", "no-such-run"]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


# -- the scripted run (SQLite and PostgreSQL, real Redis) ---------------------------------------


async def test_the_scripted_run_answers_from_every_tool_result(make_agent: Callable[..., tuple[App, Agent]]) -> None:
    model = scripted_model()
    app, agent = make_agent(model)
    run_id = start(agent)
    await run_until_quiet(app)

    run = agent.get_run(run_id)
    assert (run.state, run.output) == ("DONE", EXPECTED_ANSWER)
    assert model.calls == 3  # one model call per turn
    assert [t["index"] for t in run.turns] == [0, 1, 2]
    assert run.turns[0]["tool_results"] == {
        "call_calc": {"ok": 42.0},
        "call_kv": {"ok": "Paris"},
        "call_search": {"ok": ["Durable execution: code that survives crashes by recording each step"]},
    }
    assert run.turns[1]["tool_results"] == {"call_report": {"ok": "REPORT (3 findings)"}}
    assert run.turns[2]["tool_results"] is None

    by_call = tool_tasks(app)
    assert sorted(by_call) == ["call_calc", "call_kv", "call_report", "call_search"]
    assert all(t.state == TaskState.SUCCEEDED for t in by_call.values())
    flaky = by_call["call_search"]
    assert outcomes(flaky) == ["failed", "failed", "succeeded"]  # retried by the runtime, not the model
    assert [a.error_type for a in flaky.attempts[:2]] == ["ConnectionError", "ConnectionError"]
    assert all(outcomes(t) == ["succeeded"] for c, t in by_call.items() if c != "call_search")


async def test_a_division_by_zero_is_reported_to_the_model_not_retried(
    make_agent: Callable[..., tuple[App, Agent]],
) -> None:
    seen: dict[str, Any] = {}

    def script(messages: list[dict[str, Any]]) -> ModelTurn:
        if not any(m["role"] == "assistant" for m in messages):
            return ModelTurn(
                tool_calls=[
                    ToolCall(id="div", name="calculator", arguments={"a": 1, "b": 0, "op": "/"}),
                    ToolCall(id="key", name="kv_lookup", arguments={"key": "no_such_fact"}),
                ]
            )
        seen.update({m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"})
        return ModelTurn(content="I could not compute that.")

    app, agent = make_agent(ScriptedModel(script))
    run_id = start(agent, "what is 1 / 0?")
    await run_until_quiet(app)

    assert agent.get_run(run_id).state == "DONE"
    assert seen["div"] == {"error": "ZeroDivisionError: division by zero"}
    assert seen["key"]["error"].startswith("LookupError: no fact named 'no_such_fact'")
    by_call = tool_tasks(app)
    for call in ("div", "key"):
        assert by_call[call].state == TaskState.FAILED
        assert outcomes(by_call[call]) == ["failed"]  # one attempt: not retried


# -- the OpenAI adapter ------------------------------------------------------------------------


def test_the_adapter_parses_the_recorded_responses_into_model_turns() -> None:
    replay = ReplayCompletions(FIXTURE)
    first, second = (OpenAIChatModel.parse_response(r) for r in replay.responses)
    assert first == ModelTurn(
        content=None,
        tool_calls=[ToolCall(id="call_Q3mZ1x9Lk2", name="calculator", arguments={"a": 12, "b": 3.5, "op": "*"})],
    )
    assert second == ModelTurn(content="12 * 3.5 = 42.", tool_calls=[])


@pytest.mark.parametrize(
    ("raw", "arguments"),
    [
        ('{"a": 1, "b": ', {INVALID_JSON_KEY: '{"a": 1, "b": '}),
        ("[1, 2]", {INVALID_JSON_KEY: "[1, 2]"}),  # JSON, but not an object
        ("", {}),
        ({"a": 1}, {"a": 1}),  # some compatible servers send an object
    ],
)
def test_arguments_that_are_not_a_json_object_are_kept_for_the_tool_to_reject(
    raw: Any, arguments: dict[str, Any]
) -> None:
    response = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": raw}}],
                }
            }
        ]
    }
    turn = OpenAIChatModel.parse_response(response)
    assert turn.tool_calls == [ToolCall(id="c1", name="calc", arguments=arguments)]


def test_the_adapter_sends_openai_shaped_requests(tmp_path: Path) -> None:
    _, agent = build(database_url=f"sqlite:///{tmp_path / 'a.sqlite3'}", redis_url="redis://127.0.0.1:1")
    specs = [spec for spec, _, _ in agent.tools.values()]
    replay = ReplayCompletions(FIXTURE)
    model = OpenAIChatModel(replay, model="gpt-4o-mini")
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "12 * 3.5?"},
        {"role": "assistant", "content": "thinking", "tool_calls": []},  # OpenAI rejects []
    ]
    turn = model.complete(messages, specs)
    assert turn.tool_calls[0].name == "calculator"

    (request,) = replay.requests
    assert request["model"] == "gpt-4o-mini"
    assert request["messages"] == [messages[0], {"role": "assistant", "content": "thinking"}]
    assert [t["type"] for t in request["tools"]] == ["function"] * 4
    functions = {t["function"]["name"]: t["function"] for t in request["tools"]}
    assert list(functions) == ["calculator", "kv_lookup", "flaky_search", "slow_report"]
    calc = functions["calculator"]
    assert set(calc) == {"name", "description", "parameters"}
    assert calc["description"] == "Evaluate a op b for op in + - * /."
    assert calc["parameters"]["type"] == "object"
    assert set(calc["parameters"]["properties"]) == {"a", "b", "op"}
    assert sorted(calc["parameters"]["required"]) == ["a", "b", "op"]
    assert calc["parameters"]["properties"]["op"]["enum"] == ["+", "-", "*", "/"]
    json.dumps(request)  # the request is plain JSON


async def test_a_run_over_recorded_openai_responses_completes(make_agent: Callable[..., tuple[App, Agent]]) -> None:
    replay = ReplayCompletions(FIXTURE)
    app, agent = make_agent(OpenAIChatModel(replay))
    run_id = start(agent, "What is 12 * 3.5?")
    await run_until_quiet(app)

    run = agent.get_run(run_id)
    assert (run.state, run.output) == ("DONE", "12 * 3.5 = 42.")
    assert run.turns[0]["tool_results"] == {"call_Q3mZ1x9Lk2": {"ok": 42.0}}
    assert len(replay.requests) == 2
    user, assistant, tool = replay.requests[1]["messages"]
    assert user == {"role": "user", "content": "What is 12 * 3.5?"}
    assert assistant["role"] == "assistant"
    (call,) = assistant["tool_calls"]
    assert (call["id"], call["type"], call["function"]["name"]) == ("call_Q3mZ1x9Lk2", "function", "calculator")
    assert json.loads(call["function"]["arguments"]) == {"a": 12, "b": 3.5, "op": "*"}
    assert tool == {"role": "tool", "tool_call_id": "call_Q3mZ1x9Lk2", "content": json.dumps({"ok": 42.0})}


async def test_invalid_json_arguments_become_a_tool_error_not_a_crash(
    make_agent: Callable[..., tuple[App, Agent]], tmp_path: Path
) -> None:
    recorded = json.loads(FIXTURE.read_text())
    recorded["responses"][0]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"a": 12, "b": '
    recorded["responses"][1]["choices"][0]["message"]["content"] = "Sorry, my arguments were malformed."
    fixture = tmp_path / "invalid.json"
    fixture.write_text(json.dumps(recorded))
    replay = ReplayCompletions(fixture)
    app, agent = make_agent(OpenAIChatModel(replay))
    run_id = start(agent, "What is 12 * 3.5?")
    await run_until_quiet(app)

    run = agent.get_run(run_id)
    assert (run.state, run.output) == ("DONE", "Sorry, my arguments were malformed.")
    error = run.turns[0]["tool_results"]["call_Q3mZ1x9Lk2"]["error"]
    assert error.startswith("invalid arguments for calculator")
    assert INVALID_JSON_KEY in error
    calc = tool_tasks(app)["call_Q3mZ1x9Lk2"]
    assert outcomes(calc) == ["succeeded"]  # the model's mistake: answered once, never retried
    tool_message = replay.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert "invalid arguments for calculator" in tool_message["content"]


# -- a real process SIGKILLed in the middle of a run ---------------------------------------------


def child_env(app: App, tmp_path: Path, call_log: Path, *, slow_seconds: float) -> dict[str, str]:
    s = app.settings
    assert s.database_url is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DT_", "AGENT_"))}
    return env | {
        "PYTHONPATH": str(REPO_ROOT),
        "DT_DATABASE_URL": s.database_url,
        "DT_REDIS_URL": app.redis_url,
        "DT_NAMESPACE": s.namespace,
        "DT_DATA_DIR": str(tmp_path / "child-data"),
        "DT_LEASE_TIMEOUT": "1",
        "DT_HEARTBEAT_INTERVAL": "0.3",
        "DT_REAPER_INTERVAL": "0.5",
        "DT_POLL_INTERVAL": "0.1",
        "DT_READ_BLOCK": "0.1",
        "DT_RETRY_BACKOFF_INITIAL": "0",
        "DT_RETRY_BACKOFF_MAX": "0",
        "DT_BACKOFF_JITTER": "0",
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
async def test_a_run_killed_mid_tool_resumes_without_calling_the_model_again(
    make_agent: Callable[..., tuple[App, Agent]], tmp_path: Path
) -> None:
    app, agent = make_agent()  # this process only reads the records
    call_log = tmp_path / "model-calls.jsonl"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    children: list[Process] = []
    try:
        first = await spawn([QUESTION], child_env(app, tmp_path, call_log, slow_seconds=30), first_log, children)

        def run_id_line() -> str | None:
            lines = first_log.read_text().splitlines() if first_log.exists() else []
            return next((line.removeprefix("run_id=") for line in lines if line.startswith("run_id=")), None)

        run_id: str = await wait_for("run_id", run_id_line, first, first_log)

        def slow_report_running() -> TaskInfo | None:
            report = tool_tasks(app).get("call_report")
            return report if report is not None and report.state == TaskState.RUNNING else None

        running: TaskInfo = await wait_for("slow_report RUNNING", slow_report_running, first, first_log)
        assert running.attempts[-1].worker_id.split(":")[1] == str(first.pid)
        os.kill(first.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            assert await first.wait() == -signal.SIGKILL
        assert agent.get_run(run_id).state == "RUNNING"

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

    assert f"run_id={run_id}" in output
    assert f"answer: {EXPECTED_ANSWER}" in output
    run = agent.get_run(run_id)
    assert (run.state, run.output) == ("DONE", EXPECTED_ANSWER)

    by_call = tool_tasks(app)
    assert sorted(by_call) == ["call_calc", "call_kv", "call_report", "call_search"]
    for call_id, task in by_call.items():
        assert task.state == TaskState.SUCCEEDED, (call_id, task.error_type, task.error_message)
        assert outcomes(task).count("succeeded") == 1, (call_id, outcomes(task))
    report = by_call["call_report"]
    assert outcomes(report) == ["lost", "succeeded"]
    assert report.attempts[0].worker_id.split(":")[1] == str(first.pid)
    assert report.attempts[1].worker_id.split(":")[1] == str(second.pid)
    assert report.reclaims == 1
    assert outcomes(by_call["call_search"]) == ["failed", "failed", "succeeded"]

    turns = [t for t in tasks(app) if t.name == TURN_TASK]
    assert [outcomes(t) for t in turns] == [["succeeded"]] * 3
    calls = [json.loads(line) for line in call_log.read_text().splitlines()]
    assert calls == [{"turn": 0}, {"turn": 1}, {"turn": 2}]  # no turn was sent to the model twice
