"""Suspect attempts (their worker was lost before) run apart from the others: a suspect waits
for the running shared attempts, and none starts beside it. Suspects run together in groups
within every member's limit; one of limit 1 runs alone. Whatever waits at the gate keeps its
lease."""

from __future__ import annotations

import anyio
import pytest

from durable_tasks.isolation import IsolationGate

pytestmark = pytest.mark.anyio


async def test_a_suspect_runs_alone() -> None:
    gate = IsolationGate()
    timeline: list[str] = []
    held: list[str] = []
    first_started = anyio.Event()

    async def normal(name: str, delay: float, started: anyio.Event | None = None) -> None:
        await gate.join(held.append, name)
        try:
            timeline.append(f"{name}+")
            if started is not None:
                started.set()
            await anyio.sleep(delay)
            timeline.append(f"{name}-")
        finally:
            gate.leave()

    async def suspect() -> None:
        async with gate.suspect(limit=1, hold=lambda: held.append("S")) as alone:
            assert alone
            timeline.append("S+")
            await anyio.sleep(0.05)
            timeline.append("S-")

    async with anyio.create_task_group() as tg:
        tg.start_soon(normal, "a", 0.1, first_started)
        await first_started.wait()
        tg.start_soon(suspect)
        await anyio.sleep(0.01)
        assert gate.isolating
        tg.start_soon(normal, "b", 0.01)
    # Their leases were kept while they waited: the suspect's, and b's behind it (a never waited).
    assert held == ["S", "b"]
    assert timeline == ["a+", "a-", "S+", "S-", "b+", "b-"]
    assert not gate.isolating


async def test_suspects_run_together_within_their_limits_and_one_of_limit_1_alone() -> None:
    gate = IsolationGate()
    timeline: list[str] = []
    alone_of: dict[str, bool] = {}
    release = {name: anyio.Event() for name in ("s1", "s2", "s3", "solo", "late", "shared")}
    started = {name: anyio.Event() for name in release}

    async def suspect(name: str, limit: int) -> None:
        async with gate.suspect(limit=limit, hold=lambda: None) as alone:
            alone_of[name] = alone
            timeline.append(f"{name}+")
            started[name].set()
            await release[name].wait()
            timeline.append(f"{name}-")

    async def shared() -> None:
        await gate.join(lambda _: None, "shared")
        try:
            timeline.append("shared+")
            started["shared"].set()
            await release["shared"].wait()
        finally:
            gate.leave()

    async with anyio.create_task_group() as tg:
        for name in ("s1", "s2", "s3"):
            tg.start_soon(suspect, name, 4)
            await started[name].wait()  # each joins the running group: all three run at once
        assert gate.room == 1
        tg.start_soon(suspect, "solo", 1)  # must run alone: waits for the group to end
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(suspect, "late", 4)  # fits the group, but comes after "solo": waits
        tg.start_soon(shared)  # never beside a suspect
        await anyio.wait_all_tasks_blocked()
        assert timeline == ["s1+", "s2+", "s3+"]
        assert gate.room == 0
        for name in ("s1", "s2", "s3"):
            release[name].set()
        await started["solo"].wait()
        await anyio.wait_all_tasks_blocked()
        assert timeline[-1] == "solo+"  # nothing beside it
        release["solo"].set()
        await started["late"].wait()
        release["late"].set()
        await started["shared"].wait()
        release["shared"].set()
    assert timeline[3:] == ["s1-", "s2-", "s3-", "solo+", "solo-", "late+", "late-", "shared+"]
    assert alone_of == {"s1": False, "s2": False, "s3": False, "solo": True, "late": False}
    assert not gate.isolating


async def test_a_group_admits_no_more_than_its_smallest_limit() -> None:
    gate = IsolationGate()
    running = 0
    most = 0
    go = anyio.Event()

    async def suspect(limit: int) -> None:
        nonlocal running, most
        async with gate.suspect(limit=limit, hold=lambda: None):
            running += 1
            most = max(most, running)
            await go.wait()
            running -= 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(suspect, 16)
        await anyio.wait_all_tasks_blocked()
        for _ in range(10):
            tg.start_soon(suspect, 3)
        await anyio.wait_all_tasks_blocked()
        assert running == 3  # the one of 16 and two of 3: a third would make a group of 4
        go.set()
    assert most == 3
