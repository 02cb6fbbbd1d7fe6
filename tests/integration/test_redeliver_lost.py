"""Store.redeliver_lost: a reaper page of lost deliveries superseded in one transaction, on
every backend, with the same answer per item as Store.redeliver gives for one; a reaper page
is ``reaper_batch`` entries."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks.records import AttemptOutcome, OutboxState, attempts_table
from durable_tasks.store.results import FinalWrite
from tests.helpers import outlive_lease, statements_on, submit_all, task_row
from tests.integration.test_store import LEASE, claimed, lease, outbox_rows, submit

pytestmark = pytest.mark.anyio

REASON = "worker lost: lease expired, entry reclaimed"


@pytest.fixture
def app(make_app: Callable[..., App], clock: FrozenClock) -> App:
    return make_app(clock=clock)


def attempt_outcomes(app: App, task_id: str) -> list[tuple[int, str | None]]:
    a = attempts_table.c
    with app.runtime.store.read_engine.connect() as conn:
        rows = conn.execute(sa.select(a.attempt, a.outcome, a.retry_reason).where(a.task_id == task_id))
        return [(r.attempt, r.outcome and f"{r.outcome}: {r.retry_reason}") for r in rows]


async def test_each_item_is_answered_as_redeliver_answers_it(app: App, clock: FrozenClock) -> None:
    store, ns = app.runtime.store, app.settings.namespace
    unclaimed, lost, solo, live, done = submit(app, 5)
    await claimed(app, lost)
    await store.mark_solo(await claimed(app, solo), now=app.clock())
    await store.commit_results([FinalWrite(await claimed(app, done), "1")], now=app.clock())
    held = await claimed(app, live)
    clock.advance(LEASE * 2)
    assert await store.heartbeat(held, now=app.clock(), lease=LEASE)
    keys = [
        (solo, 0, 0),
        (unclaimed, 0, 0),
        (lost, 0, 0),
        (lost, 0, 0),  # the same entry twice (a harmless duplicate XADD): redelivered once
        (unclaimed, 1, 0),  # a generation the task never had: stale
        (live, 0, 0),  # its worker holds a live lease
        (done, 0, 0),  # finished
        ("no-such-task", 0, 0),
    ]
    flags = await store.redeliver_lost(ns, keys, now=app.clock(), reason=REASON)
    assert flags == [True, True, True, False, False, False, False, False]
    rows = {task_id: task_row(app, task_id) for task_id in (unclaimed, lost, solo, live, done)}
    assert {i: (r.state, r.delivery, r.reclaims, r.counted_losses) for i, r in rows.items()} == {
        unclaimed: (TaskState.PENDING, 1, 0, 0),  # lost before any claim: ran nothing, not a suspect
        lost: (TaskState.PENDING, 1, 1, 0),  # lost beside others: a suspect, not charged
        solo: (TaskState.PENDING, 1, 1, 1),  # lost while running alone: its own loss
        live: (TaskState.RUNNING, 0, 0, 0),
        done: (TaskState.SUCCEEDED, 0, 0, 0),
    }
    assert all(rows[i].lease_expires_at is None for i in (unclaimed, lost, solo))
    for task_id in (unclaimed, lost, solo):
        assert outbox_rows(app, task_id)[-1] == (OutboxState.PENDING, 0, 1)
    assert outbox_rows(app, live) == [(OutboxState.PENDING, 0, 0)]
    assert attempt_outcomes(app, lost) == [(1, f"{AttemptOutcome.LOST}: {REASON}")]
    assert attempt_outcomes(app, live) == [(1, None)]
    # Redis losing entries (the reconciler) is nobody's fault: no reclaim is counted.
    assert await store.redeliver_lost(ns, [(lost, 0, 1)], now=app.clock(), reason="gone", count_reclaim=False)
    assert (task_row(app, lost).delivery, task_row(app, lost).reclaims) == (2, 1)


async def test_a_loss_makes_a_task_more_suspect_only_once_its_attempt_started(app: App, clock: FrozenClock) -> None:
    """A suspect's attempt is claimed held (no start), as is every attempt claimed with
    ``hold`` (its worker isolates): losing its worker before the start is recorded leaves its
    reclaims as they were; after ``mark_started`` or ``mark_solo`` the loss counts as one."""
    store, ns = app.runtime.store, app.settings.namespace
    waited, started, solo, shared = submit(app, 4)
    for task_id in (waited, started, solo):  # each lost once while it ran: a suspect
        assert not (await claimed(app, task_id)).held
    clock.advance(LEASE * 2)
    assert await store.redeliver_lost(ns, [(i, 0, 0) for i in (waited, started, solo)], now=app.clock(), reason=REASON)
    claims = {i: await claimed(app, i, 1) for i in (waited, started, solo)}
    claims[shared] = await claimed(app, shared, hold=True)
    assert all(c.held for c in claims.values())
    assert {i: task_row(app, i).started_at for i in claims} == dict.fromkeys(claims)  # none started
    await store.mark_started([claims[started]], now=app.clock())
    await store.mark_solo(claims[solo], now=app.clock())
    assert task_row(app, started).started_at == task_row(app, solo).started_at == app.clock()
    clock.advance(LEASE * 2)
    keys = [(waited, 0, 1), (started, 0, 1), (solo, 0, 1), (shared, 0, 0)]
    assert await store.redeliver_lost(ns, keys, now=app.clock(), reason=REASON) == [True] * 4
    rows = {i: task_row(app, i) for i in claims}
    assert {i: (r.state, r.delivery, r.reclaims, r.counted_losses) for i, r in rows.items()} == {
        waited: (TaskState.PENDING, 2, 1, 0),  # lost while it waited: as suspect as before
        started: (TaskState.PENDING, 2, 2, 0),  # lost in its group: more suspect
        solo: (TaskState.PENDING, 2, 2, 1),  # lost alone: its own loss
        shared: (TaskState.PENDING, 1, 0, 0),  # lost while it waited behind suspects: not a suspect
    }


async def test_a_page_costs_the_statements_of_one_item(app: App, clock: FrozenClock) -> None:
    """A dead worker's page of lost deliveries is a fixed number of statements, not a few per
    task (on PostgreSQL, one): recovering thousands of tasks is paced by pages, not by rows."""
    store, ns = app.runtime.store, app.settings.namespace
    one, *page = submit(app, 41)
    await lease(app)
    clock.advance(timedelta(minutes=1))
    counts = []
    for ids in ([one], page):
        with statements_on(store.engine, lambda sql: not sql.lstrip().upper().startswith("BEGIN")) as seen:
            assert await store.redeliver_lost(ns, [(i, 0, 0) for i in ids], now=app.clock(), reason=REASON) == [
                True
            ] * len(ids)
        counts.append(len(seen))
    assert counts[1] == counts[0] <= 6, counts
    if store.engine.dialect.name == "postgresql":
        assert counts[0] == 2, counts  # one statement (store/sql/postgres.sql) and the dispatchers' wake-up


async def test_a_reaper_page_is_reaper_batch_entries(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker lost with 150 entries, at reaper_batch=150: one page, one redelivery
    transaction (pages were capped at 100 entries, whatever the setting)."""
    app = make_app(clock=FrozenClock(), reaper_batch=150)

    @app.task(name="lost.job", queue="lost")
    def job(ctx: TaskContext[int], n: int) -> int:
        return n

    submit_all(app, job, range(150))
    assert await app.dispatch_once() == 150
    entries = await app.runtime.transport().read(["lost"], "dead-worker", count=150, block=timedelta(0))
    assert len(entries) == 150  # read, then the worker died
    pages: list[int] = []
    store = app.runtime.store
    redeliver_lost = store.redeliver_lost

    async def counted(namespace: str, lost: Sequence[tuple[str, int, int]], **kwargs: Any) -> list[bool]:
        pages.append(len(lost))
        return await redeliver_lost(namespace, lost, **kwargs)

    monkeypatch.setattr(store, "redeliver_lost", counted)
    assert await outlive_lease(app) == 150
    assert (await app.reap_once()).redelivered == 150
    assert pages == [150]
