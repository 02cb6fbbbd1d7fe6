"""Rate limits and per-key concurrency limits (durable_tasks.flow): admission in Redis
(admit.lua) before the claim; a delivery over its limit steps aside as a new delivery due
later, with no attempt counted; slots count leases, so an abandoned slot frees itself; limits
change at run time and read back as they apply."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from durable_tasks import App, InvalidFlowControlError, TaskContext
from durable_tasks.flow.gate import FlowKeys, holder
from durable_tasks.records import TaskState, tasks_table
from durable_tasks.transport.messages import Delivery
from tests.helpers import submit, submit_all, wait_until

pytestmark = pytest.mark.anyio


def delivery(n: int, name: str, key: str | None = None) -> Delivery:
    return Delivery(f"task-{n}", 0, 0, name, None, key)


def rows(app: App) -> list[Any]:
    with app.engine.connect() as conn:
        query = sa.select(tasks_table.c.state, tasks_table.c.attempt, tasks_table.c.delivery).where(
            tasks_table.c.namespace == app.settings.namespace
        )
        return list(conn.execute(query).all())


async def run_until_all_succeeded(app: App, count: int, timeout: float = 120) -> None:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, reaper=False, stop=stop))
        await wait_until(
            lambda: sum(r.state == TaskState.SUCCEEDED for r in rows(app)) == count,
            timeout=timeout,
            what=f"{count} tasks succeeded",
        )
        stop.set()


async def test_a_rate_admits_its_burst_then_tells_the_wait(make_app: Callable[..., App]) -> None:
    app = make_app()
    openai = app.limit("openai", rate="1/h", burst=2)

    @app.task(name="call", queue="jobs", rate_limit=openai)
    def call(ctx: TaskContext[int], n: int) -> None:
        return None

    waits = await app.runtime.flow.admit([delivery(n, "call") for n in range(4)])
    assert waits[:2] == [0, 0]
    assert 3600 * 0.9 < waits[2] < waits[3] <= 2 * 3600 * 1.1  # staggered: each as if the one before went
    await app.aclose()


async def test_a_concurrency_key_holds_its_limit_and_frees_on_release_or_expiry(
    make_app: Callable[..., App],
) -> None:
    app = make_app()

    @app.task(name="judge", queue="jobs", concurrency_limit=1)
    def judge(ctx: TaskContext[int], n: int) -> None:
        return None

    gate = app.runtime.flow
    first, second, other = delivery(1, "judge", "user:1"), delivery(2, "judge", "user:1"), delivery(3, "judge", "u:2")
    waits = await gate.admit([first, second, other])
    assert waits[0] == 0
    assert waits[1] > 0
    assert waits[2] == 0
    assert (await gate.admit([first]))[0] == 0  # the same delivery again takes no second slot
    await gate.release([holder(first)])
    assert (await gate.admit([second]))[0] == 0
    # A worker that dies keeps no slot past its lease: a slot whose expiry passed is free.
    slots = FlowKeys(app.settings.namespace).slots("task:judge", "user:1")
    await app.runtime.transport().client.zadd(slots, {"task-2:0:0": 0})
    assert (await gate.admit([delivery(4, "judge", "user:1")]))[0] == 0
    await app.aclose()


async def test_tasks_over_a_rate_wait_without_spending_attempts(make_app: Callable[..., App]) -> None:
    app = make_app(concurrency=8)
    starts: list[float] = []

    @app.task(name="call", queue="jobs", rate_limit="20/s")
    async def call(ctx: TaskContext[int], n: int) -> None:
        starts.append(time.monotonic())

    submit_all(app, "call", range(30))
    await run_until_all_succeeded(app, 30)
    assert all(r.attempt == 1 for r in rows(app))  # waiting spent no attempt
    assert any(r.delivery > 0 for r in rows(app))  # some waited: a new delivery each time
    starts.sort()
    # GCRA with burst 1: any 11 consecutive starts span at least 10 intervals (0.5 s), less a
    # little for the spread between the server's clock and this process's.
    assert min(b - a for a, b in zip(starts, starts[10:], strict=False)) >= 0.45
    await app.aclose()


async def test_one_running_attempt_per_key_and_other_keys_go_on(make_app: Callable[..., App]) -> None:
    app = make_app(concurrency=6)
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)

    @app.task(name="judge", queue="jobs", concurrency_limit=1)
    async def judge(ctx: TaskContext[str], key: str) -> None:
        start = time.monotonic()
        await anyio.sleep(0.02)  # a body that takes time, so two attempts of one key would overlap
        intervals[key].append((start, time.monotonic()))

    for n in range(24):
        submit(app, "judge", f"user:{n % 3}", concurrency_key=f"user:{n % 3}")
    await run_until_all_succeeded(app, 24)
    assert all(r.attempt == 1 for r in rows(app))
    for spans in intervals.values():
        spans.sort()
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
    await app.aclose()


async def test_a_limit_changes_at_run_time_and_reads_back(make_app: Callable[..., App]) -> None:
    app = make_app()
    openai = app.limit("openai", rate="3000/m", burst=5)
    tools = app.limit("tools", concurrency=2)

    @app.task(name="call", queue="jobs", rate_limit=openai, concurrency_limit=tools)
    def call(ctx: TaskContext[int], n: int) -> None:
        return None

    [before, _] = await app.limits_status()
    assert (before.name, before.rate, before.burst, before.changed) == ("openai", "3000/m", 5, False)
    await app.set_limit("openai", rate="1/h", burst=1)
    await app.set_limit("tools", concurrency=3)
    [after, tools_now] = await app.limits_status()
    assert (after.rate, after.burst, after.changed) == ("1/h", 1, True)
    assert tools_now.concurrency == 3
    waits = await app.runtime.flow.admit([delivery(n, "call", "run:1") for n in range(2)])
    assert waits[0] == 0
    assert waits[1] > 3000
    assert await app.clear_limit("openai")
    assert (await app.limits_status())[0].changed is False
    with pytest.raises(InvalidFlowControlError, match="no limit named"):
        await app.set_limit("nope", rate="1/s")
    await app.aclose()


async def test_overlapping_limit_changes_of_one_limit_all_hold(make_app: Callable[..., App]) -> None:
    app = make_app()
    openai = app.limit("openai", rate="600/m", burst=3, concurrency=5)

    @app.task(name="llm", queue="jobs", rate_limit=openai, concurrency_limit=openai)
    def llm(ctx: TaskContext[int], n: int) -> None:
        return None

    async with anyio.create_task_group() as tg:  # two operators at once: both read the setting first
        tg.start_soon(partial(app.set_limit, "openai", rate="1200/m"))
        tg.start_soon(partial(app.set_limit, "openai", concurrency=9))
        tg.start_soon(partial(app.set_limit, "openai", burst=7))
    [info] = await app.limits_status()
    assert (info.rate, info.burst, info.concurrency) == ("1200/m", 7, 9)
    await app.aclose()


def test_a_concurrency_key_needs_a_concurrency_limit(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="plain", queue="jobs")
    def plain(ctx: TaskContext[int], n: int) -> None:
        return None

    with pytest.raises(InvalidFlowControlError, match="needs a concurrency limit"):
        submit(app, "plain", 1, concurrency_key="user:1")


@pytest.mark.parametrize("rate", ["600", "0/s", "10/fortnight", "-1/m"])
def test_a_bad_rate_is_a_typed_error(make_app: Callable[..., App], rate: str) -> None:
    app = make_app()
    with pytest.raises(InvalidFlowControlError, match="rate"):
        app.task(name="x", rate_limit=rate)(lambda ctx, n: None)
