"""The tasks lost with one worker are suspects that run together in the next worker life (with
other suspects only), not one after another; one lost again in a group runs in a smaller one,
and only an attempt that ran alone is marked solo (its loss counts)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.records import tasks_table
from tests.helpers import claim_entry, make_idle

pytestmark = pytest.mark.anyio

N = 50


async def _lose_all(app: App, queue: str, worker_id: str) -> None:
    """Read and claim every entry of ``queue`` as ``worker_id``, which then "dies": the reaper
    redelivers them all (suspects now), and the dispatcher publishes them."""
    transport = app.runtime.transport()
    entries = await transport.read([queue], worker_id, count=N, block=app.settings.read_block)
    assert len(entries) == N
    for entry in entries:
        assert await claim_entry(app, entry, worker_id, lease=timedelta(milliseconds=1)) is not None
    await make_idle(app, timedelta(seconds=5))
    redelivered = 0
    with anyio.fail_after(60):
        while redelivered < N:
            redelivered += (await app.reap_once()).redelivered
    published = 0
    with anyio.fail_after(60):
        while published < N:
            published += await app.dispatch_once()


async def test_a_worker_lost_with_50_running_tasks_has_them_all_run_together_next_life(
    make_app: Callable[..., App],
) -> None:
    app = make_app(concurrency=64)  # groups of up to 64 first-time suspects
    started = 0
    most = 0
    lock = threading.Lock()
    all_started = threading.Event()

    @app.task(name="meet", queue="groups")
    def meet(ctx: TaskContext[int], n: int) -> int:
        nonlocal started, most
        with lock:
            started += 1
            most = max(most, started)
            if started == N:
                all_started.set()
        # Each waits for all the others to be running beside it: run one at a time (or in
        # groups under N), the first would wait in vain and every one would return 0.
        met = all_started.wait(30)
        with lock:
            started -= 1
        return n if met else 0

    with Session(app.engine) as session:
        ids = [meet.submit(session, i + 1).id for i in range(N)]
        session.commit()
    while await app.dispatch_once():
        pass
    await _lose_all(app, "groups", "dead-worker")

    assert await app.work(max_tasks=N, timeout=timedelta(seconds=90)) == N
    assert most == N
    for i, task_id in enumerate(ids):
        info = app.get_task(task_id)
        assert (info.state, info.result, info.reclaims) == (TaskState.SUCCEEDED, i + 1, 1)
    with app.engine.connect() as conn:
        rows = conn.execute(
            sa.select(tasks_table.c.solo_attempt, tasks_table.c.started_at).where(tasks_table.c.id.in_(ids))
        ).all()
    assert {r.solo_attempt for r in rows} == {None}  # they ran in a group: none alone, so a loss would not have counted
    # Claimed held (suspects), each had its start recorded before it ran: a loss in the group would
    # have made them more suspect.
    assert None not in {r.started_at for r in rows}
    await app.aclose()


async def test_a_suspect_lost_again_runs_in_a_smaller_group_down_to_alone(make_app: Callable[..., App]) -> None:
    app = make_app(concurrency=16)  # limits 16, then 1

    @app.task(name="one", queue="groups")
    def one(ctx: TaskContext[int], n: int) -> int:
        return n

    with Session(app.engine) as session:
        task_id = one.submit(session, 7).id
        session.commit()
    assert await app.dispatch_once() == 1
    for worker in ("dead-1", "dead-2"):  # lost twice: reclaims 2, group limit 16 >> 4 = 1
        [entry] = await app.runtime.transport().read(["groups"], worker, count=1, block=app.settings.read_block)
        claim = await claim_entry(app, entry, worker, lease=timedelta(milliseconds=1))
        assert claim is not None
        # Its attempt started (a suspect's is claimed held: its worker records the start before
        # it runs), then the worker died: each loss makes it more suspect.
        await app.runtime.store.mark_started([claim], now=app.clock())
        await make_idle(app, timedelta(seconds=5))
        assert (await app.reap_once()).redelivered == 1
        assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=60)) == 1
    info = app.get_task(task_id)
    assert (info.state, info.reclaims) == (TaskState.SUCCEEDED, 2)
    with app.engine.connect() as conn:
        solo = conn.execute(sa.select(tasks_table.c.solo_attempt).where(tasks_table.c.id == task_id)).scalar_one()
    assert solo == 3  # its third attempt ran alone: marked solo
    await app.aclose()
