"""pydantic-ai and the OpenAI Agents SDK on durable_tasks, offline (scripted models), on SQLite
and PostgreSQL with real Redis: parallel tool calls, a flaky tool retried, an invalid argument
handed back to the model, SIGKILL of the worker at each point of a run and resume, a rerun
that fences the superseded branch out, a dead-lettered tool call, and an approval round trip.

Counted over the whole run, across processes: every model turn returns once (``AGENT_CALL_LOG``)
and every tool's side effect is committed once (``agent_effects``, keyed by the tool task's
idempotency token).
"""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session
from typer.testing import CliRunner

from durable_tasks import App, Task, TaskState
from durable_tasks.cli import cli
from durable_tasks.transport.messages import parse_delivery
from tests.apps.agent_frameworks import ANSWER, QUESTION, build, effects_table
from tests.helpers import (
    FULL,
    aturns_true,
    child_env_of,
    die_running_alone,
    run_tree,
    run_until_quiet,
    submit,
    wait_until,
)

pytestmark = pytest.mark.anyio

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
pytest.importorskip("agents", reason="the openai-agents extra is not installed")

REPO_ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ["pydantic_ai", "openai_agents"]
WAIT_S = 90.0


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "model-calls.jsonl"
    monkeypatch.setenv("AGENT_CALL_LOG", str(path))
    monkeypatch.delenv("AGENT_KILL", raising=False)
    return path


@pytest.fixture
def framework_app(make_app: Callable[..., App]) -> Iterator[tuple[App, dict[str, Task[str, str]]]]:
    probe = make_app()  # the test's servers and fast timings, as settings
    app, tasks = build(settings=probe.settings)
    app.create_all()
    yield app, tasks
    if app.runtime.store_opened:
        app.runtime.store.close()


def turns(call_log: Path, framework: str) -> list[int]:
    lines = call_log.read_text().splitlines() if call_log.exists() else []
    return [entry["turn"] for entry in map(json.loads, lines) if entry["framework"] == framework]


def effects(app: App, framework: str) -> list[tuple[str, str]]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            sa.select(effects_table.c.tool, effects_table.c.value).where(
                effects_table.c.framework == framework, effects_table.c.namespace == app.settings.namespace
            )
        ).all()
    return sorted((r.tool, r.value) for r in rows)


EXPECTED_EFFECTS = [
    ("add", "3"),
    ("flaky", "durable agents"),
    ("lookup", "Paris"),
    ("report", "REPORT(3)"),
]


def child_tasks(app: App, parent_id: str) -> dict[str, Any]:
    """The tool tasks of a run by tool name (the slot says which tool)."""
    with app.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT id, parent_slot FROM dt_tasks WHERE parent_id = :p ORDER BY created_at"), {"p": parent_id}
        ).all()
    out: dict[str, Any] = {}
    for row in rows:
        out.setdefault(row.parent_slot.split(":")[2], []).append(app.get_task(row.id))
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_run_answers_with_parallel_tools_a_flaky_retry_and_an_invalid_argument(
    framework: str, framework_app: tuple[App, dict[str, Task[str, str]]], call_log: Path
) -> None:
    app, tasks = framework_app
    run_id = submit(app, tasks[framework], QUESTION)
    await run_until_quiet(app)

    run = app.get_task(run_id)
    assert (run.state, run.result) == (TaskState.SUCCEEDED, ANSWER)
    assert turns(call_log, framework) == [0, 1, 2]  # one model call per turn over the whole run
    assert effects(app, framework) == EXPECTED_EFFECTS  # the invalid call ran no tool
    outcomes = [a.outcome for a in run.attempts]
    assert outcomes == ["suspended", "suspended", "succeeded"]  # no slot held while tools ran
    tools = child_tasks(app, run_id)
    assert sorted(tools) == ["add", "flaky", "lookup", "report"]
    [flaky] = tools["flaky"]
    assert [a.outcome for a in flaky.attempts] == ["failed", "failed", "succeeded"]
    assert all(t.idempotency_key.startswith(f"{run_id}:0:") for ts in tools.values() for t in ts)


# -- SIGKILL at each point, then resume -----------------------------------------------------------

#: Where each worker process dies, in the order a run reaches them; the last process finishes.
KILLS: list[tuple[str, dict[str, str]]] = [
    ("inside a model call", {"AGENT_KILL": "model"}),
    ("between a model response and its tool calls' submit", {"DT_FAILPOINTS": "journal.after_step=crash"}),
    ("while suspended, before the entry is acknowledged", {"DT_FAILPOINTS": "journal.after_suspend=crash"}),
    ("inside a tool", {"AGENT_KILL": "tool"}),
    ("after a tool's commit", {"DT_FAILPOINTS": "worker.after_commit=crash"}),
]


def worker_env(app: App, tmp_path: Path, call_log: Path, extra: dict[str, str]) -> dict[str, str]:
    return child_env_of(app, tmp_path / "child-data") | {"AGENT_CALL_LOG": str(call_log), **extra}


async def run_worker_until(
    app: App, env: dict[str, str], log: Path, done: Callable[[], bool], *, expect_kill: bool
) -> None:
    """Start a worker process; wait until it is SIGKILLed (``expect_kill``) or ``done()``."""
    with log.open("ab") as out:
        child = await anyio.open_process(
            [sys.executable, "-m", "tests.apps.agent_frameworks"],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        async def ended() -> bool:
            return child.returncode is not None or (not expect_kill and await anyio.to_thread.run_sync(done))

        await aturns_true(ended, timeout=WAIT_S)  # the assertions below say what did not happen
        tail = (await anyio.Path(log).read_text())[-3000:]
        if expect_kill:
            assert child.returncode == -signal.SIGKILL, tail
        else:
            assert await anyio.to_thread.run_sync(done), tail
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await child.aclose()


#: The kill-and-resume runs on PostgreSQL in ``make test`` and on every database in
#: ``make test-full``: its crash points are the runtime's, not a dialect's (each database's
#: fences and journal are tested in test_worker_crash and test_agents).
KILL_DATABASES = ["sqlite", "postgres", "mysql"] if FULL else ["postgres"]


@pytest.mark.slow
# Six worker processes, each importing its framework (seconds on a busy machine) and waiting
# out a 1 s lease and the reaper's pass after the one before was killed.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("database_url", KILL_DATABASES, indirect=True)
@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_run_killed_at_every_point_resumes_with_each_turn_and_effect_once(
    framework: str, framework_app: tuple[App, dict[str, Task[str, str]]], call_log: Path, tmp_path: Path
) -> None:
    app, tasks = framework_app
    run_id = submit(app, tasks[framework], QUESTION)
    log = tmp_path / "workers.log"

    def finished() -> bool:
        return app.get_task(run_id).state == TaskState.SUCCEEDED

    only = {"AGENT_FRAMEWORK": framework}
    for _, extra in KILLS:
        env = worker_env(app, tmp_path, call_log, extra | only)
        await run_worker_until(app, env, log, finished, expect_kill=True)
    await run_worker_until(app, worker_env(app, tmp_path, call_log, only), log, finished, expect_kill=False)

    run = app.get_task(run_id)
    assert run.result == ANSWER
    assert turns(call_log, framework) == [0, 1, 2]  # the killed call never returned
    assert effects(app, framework) == EXPECTED_EFFECTS
    tools = child_tasks(app, run_id)
    # pydantic-ai validates arguments in place; the Agents SDK's tool does it in its task.
    invalid_calls = 0 if framework == "pydantic_ai" else 1
    assert {tool: len(ts) for tool, ts in tools.items()} == {
        "add": 1 + invalid_calls,
        "flaky": 1,
        "lookup": 1,
        "report": 1,
    }


# -- a rerun fences the superseded branch out ---------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_rerun_fences_the_superseded_branchs_late_tool_results_out(
    framework: str, framework_app: tuple[App, dict[str, Task[str, str]]], call_log: Path
) -> None:
    app, tasks = framework_app
    run_id = submit(app, tasks[framework], QUESTION)
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=30))  # turn 0 recorded; the run suspends on its tools
    assert app.get_task(run_id).state == TaskState.WAITING
    old_tools = [t.id for ts in child_tasks(app, run_id).values() for t in ts]
    with Session(app.engine) as session:
        assert app.rerun(session, run_id) == 1
        session.commit()
    await run_until_quiet(app)

    run = app.get_task(run_id)
    assert (run.state, run.generation, run.result) == (TaskState.SUCCEEDED, 1, ANSWER), await run_tree(app, run_id)
    assert {app.get_task(t).state for t in old_tools} == {TaskState.CANCELLED}  # never ran, or fenced out
    assert turns(call_log, framework) == [0, 0, 1, 2]  # turn 0 once per generation
    assert effects(app, framework) == EXPECTED_EFFECTS  # generation 1's tools only


# -- a dead-lettered tool call ends the run -------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_dead_lettered_tool_call_fails_the_run_with_the_reason(
    framework: str, make_app: Callable[..., App], call_log: Path
) -> None:
    probe = make_app(max_deliveries=1)
    app, tasks = build(settings=probe.settings)
    app.create_all()
    run_id = submit(app, tasks[framework], QUESTION)
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=30))  # suspended on its four tools
    await app.dispatch_once()
    entries = await app.runtime.transport().read(["agents"], "doomed", count=10, block=timedelta(milliseconds=200))
    add_id = child_tasks(app, run_id)["add"][0].id
    [add_entry] = [e for e in entries if parse_delivery(e.fields).task_id == add_id]
    await die_running_alone(app, add_entry)  # its worker "dies" running it alone: the reaper gives up

    async def dead_lettered() -> bool:  # once its lease has run out
        await app.reap_once()
        return app.get_task(add_id).state == TaskState.DEAD

    await wait_until(dead_lettered, timeout=WAIT_S, what="the reaper to dead-letter the tool call")
    await run_until_quiet(app)

    run = app.get_task(run_id)
    assert run.state == TaskState.FAILED
    assert "DEAD" in (run.error_message or ""), (run.error_type, run.error_message)
    assert turns(call_log, framework) == [0]  # the model was not asked again
    await app.aclose()


# -- the approval round trip ---------------------------------------------------------------------


async def invoke(args: list[str]) -> Any:
    """The CLI, as a person runs it (in a thread: it is a program of its own)."""
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, args))


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_an_approval_suspends_the_run_lists_it_and_resumes_it_once_approved(
    framework: str, cli_app_env: Callable[..., dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli_app_env(DT_POLL_INTERVAL="0.1", DT_READ_BLOCK="0.1")
    monkeypatch.delitem(sys.modules, "tests.apps.approvals_app", raising=False)
    approvals_app = importlib.import_module("tests.apps.approvals_app")  # built from this test's DT_* settings

    app = approvals_app.app
    app.create_all()
    run_id = submit(app, approvals_app.run_tasks[framework], "refund order 7")
    await run_until_quiet(app)

    waiting = app.get_task(run_id)
    assert waiting.state == TaskState.WAITING  # no worker slot, no lease, no open attempt
    assert [a.outcome for a in waiting.attempts] == ["suspended"]
    assert approvals_app.REFUNDS == []
    listed = await invoke(["approvals", "list", "--app", "tests.apps.approvals_app:app", "--json"])
    assert listed.exit_code == 0, listed.output
    [pending] = [json.loads(line) for line in listed.output.splitlines() if line.strip()]
    assert (pending["task_id"], pending["name"]) == (run_id, "approval:r1")
    assert pending["request"]["args"] == {"amount": 30}

    answered = await invoke(
        ["approvals", "approve", run_id, "approval:r1", "--app", "tests.apps.approvals_app:app", "--by", "ops"]
    )
    assert answered.exit_code == 0, answered.output
    assert "approved" in answered.output
    await run_until_quiet(app)

    done = app.get_task(run_id)
    assert (done.state, done.result) == (TaskState.SUCCEEDED, "refunded 30")
    assert [f"{framework}:30"] == approvals_app.REFUNDS
    again = await invoke(["approvals", "approve", run_id, "approval:r1", "--app", "tests.apps.approvals_app:app"])
    assert "already answered" in again.output
