"""A worker's room for large payloads: bytes handed out in arrival order up to the capacity;
one larger than the whole capacity waits for all of it; a cancelled wait leaves the line (and
lets those behind it in) or gives back what it was handed; an attempt whose claim carried its
payload takes no room, and one that waits keeps its lease."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import anyio
import pytest

from durable_tasks.payload_memory import PayloadMemory
from durable_tasks.store.execution import ExecutionClaim
from tests.helpers import first_attempt

pytestmark = pytest.mark.anyio


async def _started(tg: anyio.abc.TaskGroup, memory: PayloadMemory, size: int, granted: list[int]) -> None:
    """Start an acquire of ``size`` and return once it is granted or waiting in line."""

    async def take() -> None:
        granted.append(await memory.acquire(size))

    tg.start_soon(take)
    await anyio.wait_all_tasks_blocked()


async def test_room_is_handed_out_in_arrival_order() -> None:
    memory = PayloadMemory(100)
    granted: list[int] = []
    async with anyio.create_task_group() as tg:
        await _started(tg, memory, 60, granted)
        await _started(tg, memory, 50, granted)  # does not fit beside the 60
        await _started(tg, memory, 10, granted)  # would fit, but waits behind the 50
        assert (granted, memory.free) == ([60], 40)
        memory.release(60)
        await anyio.wait_all_tasks_blocked()
        assert (granted, memory.free) == ([60, 50, 10], 40)


async def test_a_payload_larger_than_the_capacity_waits_for_all_of_it_and_runs_alone() -> None:
    memory = PayloadMemory(100)
    granted: list[int] = []
    async with anyio.create_task_group() as tg:
        await _started(tg, memory, 30, granted)
        await _started(tg, memory, 500, granted)
        await _started(tg, memory, 1, granted)
        assert granted == [30]
        memory.release(30)
        await anyio.wait_all_tasks_blocked()
        assert (granted, memory.free) == ([30, 100], 0)  # the 1 waits until the large one ends
        memory.release(100)
        await anyio.wait_all_tasks_blocked()
        assert (granted, memory.free) == ([30, 100, 1], 99)


async def test_a_cancelled_wait_leaves_the_line_and_lets_the_next_in() -> None:
    memory = PayloadMemory(100)
    granted: list[int] = []
    head = anyio.CancelScope()

    async def cancelled_head() -> None:
        with head:
            await memory.acquire(80)

    async with anyio.create_task_group() as tg:
        await _started(tg, memory, 70, granted)
        tg.start_soon(cancelled_head)
        await anyio.wait_all_tasks_blocked()
        await _started(tg, memory, 20, granted)  # fits, but waits behind the 80
        assert (granted, memory.free) == ([70], 30)
        head.cancel()
        await anyio.wait_all_tasks_blocked()
        assert (granted, memory.free) == ([70, 20], 10)


async def test_a_wait_cancelled_after_its_grant_gives_the_room_back() -> None:
    memory = PayloadMemory(100)
    first = await memory.acquire(100)
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def waiter() -> None:
            with scope:
                await memory.acquire(40)
                pytest.fail("cancelled before it could run")

        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        scope.cancel()  # delivered when the waiter next runs, which is after...
        memory.release(first)  # ...this hands it 40
        assert memory.free == 60
    assert memory.free == 100


async def test_a_claim_that_carried_its_payload_takes_no_room_and_one_that_waits_keeps_its_lease() -> None:
    memory = PayloadMemory(100)
    held: list[ExecutionClaim] = []

    class Leases:
        def hold(self, claim: ExecutionClaim) -> None:
            held.append(claim)

    now = datetime.now(UTC)
    carried = first_attempt("ns", "t1", now)
    large = replace(first_attempt("ns", "t2", now), payload_json=None, payload_size=70)
    assert await memory.room_for(carried, Leases()) == 0
    assert await memory.room_for(large, Leases()) == 70
    assert (held, memory.free) == ([large], 30)
