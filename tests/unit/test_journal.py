"""The step journal's logic (durable_tasks.journal) over an in-memory store: slots, replay,
collecting parallel waits into one suspension, ordered starts, failures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_tasks import App, TaskContext
from durable_tasks.errors import ChildTaskFailedError, ResultNotSerializableError, SignalError
from durable_tasks.journal import Journal, StepKind, current_journal
from tests.journal_fake import FakeStore, drive

pytestmark = pytest.mark.anyio


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://127.0.0.1:1", "unit")


def journal() -> Journal:
    found = current_journal()
    assert found is not None
    return found


async def test_a_recorded_step_is_not_run_again_on_replay(app: App) -> None:
    calls: list[str] = []
    failed: list[bool] = []

    @app.task(name="double")
    async def double(ctx: TaskContext[int], n: int) -> int:
        async def expensive() -> int:
            calls.append("expensive")
            return n * 2

        first = await journal().step("expensive", expensive)
        if not failed:
            failed.append(True)
            raise ConnectionError("the attempt fails after the step")  # the next attempt replays
        return int(first)

    store = FakeStore(app)
    with pytest.raises(ConnectionError):
        await drive(store, double, 21)
    run = await drive(store, double, 21, resume=True)
    assert (run.result, calls) == (42, ["expensive"])


async def test_slots_follow_call_order_per_label(app: App) -> None:
    seen: list[str] = []

    @app.task(name="slots")
    async def slots(ctx: TaskContext[None], _: None) -> list[Any]:
        j = journal()
        values = [await j.step("a", lambda: 1), await j.step("b", lambda: 2), await j.step("a", lambda: 3)]
        seen.append(j.deterministic_id("run"))
        seen.append(j.deterministic_id("run"))
        return values

    store = FakeStore(app)
    run = await drive(store, slots, None)
    assert run.result == [1, 2, 3]
    assert sorted(store.rows[("run-1", 0)]) == ["step:a#0", "step:a#1", "step:b#0"]
    assert seen == ["run-1:0:run#0", "run-1:0:run#1"]


async def test_parallel_children_suspend_once_and_start_in_the_given_order(app: App) -> None:
    ran: list[int] = []

    @app.task(name="square")
    async def square(ctx: TaskContext[int], n: int) -> int:
        ran.append(n)
        return n * n

    @app.task(name="fan_out")
    async def fan_out(ctx: TaskContext[None], _: None) -> list[Any]:
        j = journal()

        async def one(n: int) -> Any:
            for _ in range(3 - n):  # they reach the journal in reverse order, a few loop turns apart
                await asyncio.sleep(0)
            return await j.child(square, n, label=f"square:{n}", order=n)

        return list(await asyncio.gather(*(one(n) for n in range(3))))

    store = FakeStore(app)
    run = await drive(store, fan_out, None)
    assert run.result == [0, 1, 4]
    assert store.suspensions == 1  # all three waits went into one suspension
    assert run.started == ["square:0", "square:1", "square:2"]  # in order, not in arrival order
    assert ran == [0, 1, 2]


async def test_a_running_step_keeps_the_task_from_suspending_until_it_is_recorded(app: App) -> None:
    @app.task(name="leaf")
    async def leaf(ctx: TaskContext[None], _: None) -> str:
        return "leaf"

    @app.task(name="mixed")
    async def mixed(ctx: TaskContext[None], _: None) -> list[Any]:
        j = journal()

        async def slow() -> str:
            await asyncio.sleep(0.05)
            return "slow"

        return list(await asyncio.gather(j.child(leaf, None), j.step("slow", slow)))

    store = FakeStore(app)
    run = await drive(store, mixed, None)
    assert run.result == ["leaf", "slow"]
    assert store.steps_recorded == 1  # recorded before the suspension, replayed after it
    assert store.suspensions == 1


async def test_a_failed_child_raises_in_the_parent(app: App) -> None:
    @app.task(name="broken", max_attempts=2)
    async def broken(ctx: TaskContext[None], _: None) -> None:
        raise LookupError("no such thing")

    @app.task(name="parent")
    async def parent(ctx: TaskContext[None], _: None) -> str:
        try:
            await journal().child(broken, None)
        except ChildTaskFailedError as exc:
            return f"{exc.state} {exc.error_type}: {exc.error_message}"
        return "unexpected"

    store = FakeStore(app)
    run = await drive(store, parent, None)
    assert run.result == "FAILED LookupError: no such thing"
    assert store.executions["broken"] == 2  # its own retry policy ran first


async def test_a_signal_wait_suspends_and_returns_the_delivered_payload(app: App) -> None:
    @app.task(name="gated")
    async def gated(ctx: TaskContext[None], _: None) -> Any:
        return await journal().wait_signal("go", kind=StepKind.APPROVAL, request={"why": "test"})

    store = FakeStore(app)
    waiting = await drive(store, gated, None)
    [wait] = waiting.waiting_for
    assert (wait.name, wait.kind, wait.request_json) == ("go", StepKind.APPROVAL, '{"why": "test"}')
    done = await drive(store, gated, None, resume=True, signals={"go": {"approved": True}})
    assert done.result == {"approved": True}


async def test_a_bad_child_payload_fails_the_caller_before_anything_is_submitted(app: App) -> None:
    @app.task(name="typed")
    async def typed(ctx: TaskContext[int], n: int) -> int:
        return n

    @app.task(name="caller")
    async def caller(ctx: TaskContext[None], _: None) -> str:
        try:
            await journal().child(typed, "not a number")
        except Exception as exc:
            return type(exc).__name__
        return "unexpected"

    store = FakeStore(app)
    run = await drive(store, caller, None)
    assert run.result == "PayloadValidationError"
    assert store.suspensions == 0


@pytest.mark.parametrize(
    ("value", "result_type", "reason"),
    [
        (float("nan"), None, "Out of range float values are not JSON compliant"),
        (object(), None, "is not JSON serializable"),
        ("x\udcff", str, "surrogates not allowed"),  # bytes decoded with surrogateescape
    ],
    ids=["nan", "object", "lone-surrogate-typed"],
)
async def test_a_step_whose_value_is_not_json_raises_the_typed_error_and_records_nothing(
    app: App, value: Any, result_type: Any, reason: str
) -> None:
    @app.task(name="stepper")
    async def stepper(ctx: TaskContext[None], _: None) -> str:
        try:
            await journal().step("bad", lambda: value, result_type=result_type)
        except ResultNotSerializableError as exc:
            return str(exc)
        return "unexpected"

    store = FakeStore(app)
    run = await drive(store, stepper, None)
    assert run.result.startswith("step 'bad' returned a value that is not plain JSON")
    assert reason in run.result
    assert store.steps_recorded == 0


async def test_a_wait_for_a_signal_name_that_is_not_printable_text_raises_signal_error(app: App) -> None:
    @app.task(name="waiter")
    async def waiter(ctx: TaskContext[None], _: None) -> str:
        try:
            await journal().wait_signal("answer\x00")
        except SignalError as exc:
            return str(exc)
        return "unexpected"

    store = FakeStore(app)
    run = await drive(store, waiter, None)
    assert "pass a printable string of 1-200 characters" in run.result
    assert store.suspensions == 0
