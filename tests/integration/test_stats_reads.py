"""Queue statistics read while work moves between Redis and the database.

A caller that waits for every count to reach zero (an operator watching ``status``, a test
draining its queues) must never see zeros while a task is still on its way. The statistics
read two places, and a task can move from one to the other in between; these tests make that
happen exactly between the reads, whichever comes first, and check that it is still counted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from durable_tasks import App, TaskContext
from durable_tasks.transport.messages import StreamEntry
from tests.helpers import claim_entry, queue_busy, submit

pytestmark = pytest.mark.anyio

BLOCK = timedelta(milliseconds=10)


def job_app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[int], n: int) -> int:
        return n

    return app


def between_reads(
    monkeypatch: pytest.MonkeyPatch, reads: list[tuple[Any, str]], move: Callable[[], Awaitable[None]]
) -> None:
    """Run ``move`` once, right after the first call of any of ``reads`` (object, method name)."""
    moved = False

    def wrap(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def read(*args: Any, **kwargs: Any) -> Any:
            nonlocal moved
            value = await original(*args, **kwargs)
            if not moved:
                moved = True
                await move()
            return value

        return read

    for owner, name in reads:
        monkeypatch.setattr(owner, name, wrap(getattr(owner, name)))


async def sent_job(app: App) -> None:
    submit(app, "job", 1)
    assert await app.dispatch_once() == 1


async def test_a_task_that_fails_between_the_two_reads_is_counted_before_or_after(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker commits the retry (a pending outbox row), then acknowledges the entry."""
    app = job_app(make_app)
    await sent_job(app)
    transport = app.runtime.transport()
    [entry] = await transport.read(["jobs"], "w", count=1, block=BLOCK)
    claim = await claim_entry(app, entry, "w")
    assert claim is not None

    async def fail_and_ack() -> None:
        now = app.clock()
        retry_at = now + timedelta(minutes=5)
        recorded = await app.runtime.store.record_failure(
            claim, now=now, error_type="OSError", error_message="down", retry_at=retry_at
        )
        assert recorded
        assert await transport.ack(entry.stream, [entry.entry_id]) == 1

    between_reads(monkeypatch, [(app.runtime.store, "queue_backlogs"), (transport, "snapshot")], fail_and_ack)
    stats = (await app.stats())["jobs"]
    assert queue_busy(stats), stats
    assert (await app.stats())["jobs"].outbox_backlog == 1  # the move did happen
    await app.aclose()


async def test_a_task_sent_and_claimed_between_the_two_reads_is_counted(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way: Redis is read before the dispatcher publishes the row, the database
    after a worker claimed the task. Neither the outbox nor the stream shows it then; the
    database's RUNNING does."""
    app = job_app(make_app)
    submit(app, "job", 1)
    transport = app.runtime.transport()
    claims: list[object] = []

    async def send_and_claim() -> None:
        assert await app.dispatch_once() == 1
        [entry] = await transport.read(["jobs"], "w", count=1, block=BLOCK)
        claims.append(await claim_entry(app, entry, "w"))

    between_reads(monkeypatch, [(transport, "snapshot")], send_and_claim)
    stats = (await app.stats())["jobs"]
    assert len(claims) == 1  # the move did happen
    assert claims[0] is not None
    assert (stats.outbox_backlog, stats.queue_delay_s, stats.running) == (0, 0.0, 1), stats
    assert queue_busy(stats), stats
    await app.aclose()


async def test_an_entry_read_between_the_lag_and_the_pel_is_counted(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within Redis: a worker reads the entry (lag → PEL) between the two reads of a stream."""
    app = job_app(make_app)
    await sent_job(app)
    transport = app.runtime.transport()
    read: list[StreamEntry] = []

    async def worker_reads() -> None:
        read.extend(await transport.read(["jobs"], "w", count=1, block=BLOCK))

    for stream, _, _ in transport.streams("jobs"):
        await transport.ensure_group(stream)  # as a worker's first read does: the entry is lag now
    between_reads(monkeypatch, [(transport.client, "xpending"), (transport.client, "xinfo_groups")], worker_reads)
    snap = await transport.snapshot("jobs")
    assert len(read) == 1  # the move did happen
    assert snap.pel_size + snap.stream_lag >= 1, snap  # once or twice, never zero
    await app.aclose()
