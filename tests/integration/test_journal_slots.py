"""Journal slots and the agent records' keys compare byte for byte on every backend: step labels,
child labels and signal names that differ only in case or accents are distinct, as task ids,
names and idempotency keys are (MySQL's default collations ignore both: migration 20)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.agents import Agent, ModelTurn, ScriptedModel
from durable_tasks.readmodel import agent_run, agent_runs
from tests.helpers import run_until, submit_all

pytestmark = pytest.mark.anyio

#: Labels a case- and accent-insensitive collation takes for one.
LABELS = ("Search", "search", "séarch")


def settled(app: App, task_id: str) -> bool:
    return app.get_task(task_id).state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD)


async def test_steps_whose_labels_differ_in_case_or_accents_keep_their_own_results(app: App) -> None:
    @app.task(name="three_steps", queue="jobs")
    async def three_steps(ctx: TaskContext[int], n: int) -> list[str]:
        journal = ctx.journal
        assert journal is not None
        return [await journal.step(label, partial(str, label)) for label in LABELS]

    [handle] = submit_all(app, three_steps, [0])
    await run_until(app, lambda: settled(app, handle.id), reaper=False)
    info = app.get_task(handle.id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, list(LABELS)), info
    assert [step.slot for step in app.steps(handle.id)] == [f"step:{label}#0" for label in LABELS]


async def test_children_whose_labels_differ_in_case_or_accents_settle_their_own_slots(app: App) -> None:
    @app.task(name="echo", queue="jobs")
    def echo(ctx: TaskContext[str], text: str) -> str:
        return text

    @app.task(name="fan_out", queue="jobs")
    async def fan_out(ctx: TaskContext[int], n: int) -> list[Any]:
        journal = ctx.journal
        assert journal is not None
        return [await journal.child(echo, label, label=label) for label in LABELS]

    [handle] = submit_all(app, fan_out, [0])
    await run_until(app, lambda: settled(app, handle.id), reaper=False)
    info = app.get_task(handle.id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, list(LABELS)), info
    steps = app.steps(handle.id)
    assert [(step.slot, step.done) for step in steps] == [(f"child:{label}#0", True) for label in LABELS]
    assert len({step.child_task_id for step in steps}) == len(LABELS)


async def test_a_signal_whose_name_differs_in_case_does_not_answer_a_wait(app: App) -> None:
    @app.task(name="waits", queue="jobs")
    async def waits(ctx: TaskContext[int], n: int) -> Any:
        assert ctx.journal is not None
        return await ctx.journal.wait_signal("Deploy")

    [handle] = submit_all(app, waits, [0])
    await run_until(app, lambda: app.get_task(handle.id).state is TaskState.WAITING, reaper=False)
    for other in ("deploy", "Déploy"):
        assert app.signal(handle.id, other, other)  # another signal: delivered, nobody waits for it
    assert app.get_task(handle.id).state is TaskState.WAITING, "a signal of another name resumed the wait"
    opened = {"signal:Deploy": False, "signal:deploy": True, "signal:Déploy": True}
    assert {step.slot: step.done for step in app.steps(handle.id)} == opened
    assert app.signal(handle.id, "Deploy", "go")
    await run_until(app, lambda: settled(app, handle.id), reaper=False)
    info = app.get_task(handle.id)
    assert (info.state, info.result) == (TaskState.SUCCEEDED, "go"), info


async def test_an_agent_run_is_found_by_its_own_namespace_and_id_only(app: App) -> None:
    agent = Agent(app, "helper", ScriptedModel(lambda messages: ModelTurn(content="done")))
    app.create_all()
    with Session(app.engine) as session:
        run_id = agent.start(session, "hello")
        session.commit()
    namespace = app.settings.namespace
    assert [run["id"] for run in agent_runs(app.engine, namespace).items] == [run_id]
    assert agent_runs(app.engine, namespace.upper()).items == []
    assert agent_run(app.engine, namespace.upper(), run_id) is None
    assert agent_run(app.engine, namespace, run_id.upper()) is None
    found = agent_run(app.engine, namespace, run_id)
    assert found is not None
    assert found.run["id"] == run_id
