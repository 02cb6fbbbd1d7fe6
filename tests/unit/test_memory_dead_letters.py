"""The in-memory transport's dead-letter stream pages and deletes as Redis' does, so the DLQ
read against the database (durable_tasks.dead_letters) works on it too."""

from __future__ import annotations

import anyio

from durable_tasks.clock import system_clock
from durable_tasks.transport.memory import MemoryTransport


def test_pages_continue_after_an_entry_deleted_since() -> None:
    async def scenario() -> None:
        transport = MemoryTransport("ns", clock=system_clock)
        ids = [await transport.dead_letter("q", f"d{i}", {"t": f"task{i}", "g": "0"}) for i in range(5)]
        first = await transport.dead_letter_page("q", after=None, count=2)
        assert [i for i, _ in first] == ids[:2]
        assert first[1][1] == {"t": "task1", "g": "0"}
        assert await transport.forget_dead_letters("q", [ids[1], "999-0"]) == 1
        rest = await transport.dead_letter_page("q", after=ids[1], count=10)  # ids[1] is gone
        assert [i for i, _ in rest] == ids[2:]
        assert await transport.dead_letter_page("other", after=None, count=2) == []
        assert (await transport.snapshot("q")).dlq_length == 4

    anyio.run(scenario)
