"""A suspect attempt (its worker was lost before) runs alone: it waits for the running ones,
and nothing starts beside it. Whatever waits at the gate keeps its lease."""

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
        await gate.join(hold=lambda: held.append(name))
        try:
            timeline.append(f"{name}+")
            if started is not None:
                started.set()
            await anyio.sleep(delay)
            timeline.append(f"{name}-")
        finally:
            gate.leave()

    async def suspect() -> None:
        async with gate.alone(hold=lambda: held.append("S")):
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
