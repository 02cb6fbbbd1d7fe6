"""Store.defer_deliveries (flow control's step aside): a batch of refused deliveries moves in one
transaction of a fixed number of statements, on every backend; a delivery already superseded,
running or final is left alone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from durable_tasks import App, FrozenClock, TaskState
from durable_tasks.records import OutboxState, outbox_table, tasks_table
from durable_tasks.store.deferral import Deferral
from durable_tasks.store.results import FinalWrite
from tests.helpers import statements_on, task_row
from tests.integration.test_store import claimed, outbox_rows, submit

pytestmark = pytest.mark.anyio


@pytest.fixture
def app(make_app: Callable[..., App], clock: FrozenClock) -> App:
    return make_app(clock=clock)


def set_columns(app: App, task_id: str, **values: object) -> None:
    with app.engine.begin() as conn:
        conn.execute(sa.update(tasks_table).where(tasks_table.c.id == task_id).values(**values))


def last_due(app: App, task_id: str) -> datetime:
    o = outbox_table.c
    with app.runtime.store.read_engine.connect() as conn:
        due: datetime = conn.execute(
            sa.select(o.next_attempt_at).where(o.task_id == task_id).order_by(o.id.desc()).limit(1)
        ).scalar_one()
    return due.replace(tzinfo=None)


async def test_a_mixed_batch_moves_the_waiting_and_leaves_the_stale_alone(app: App) -> None:
    store, ns, now = app.runtime.store, app.settings.namespace, app.clock()
    pending, enqueued, retrying, superseded, running, done, elsewhere = submit(app, 7)
    set_columns(app, enqueued, state=TaskState.ENQUEUED)
    set_columns(app, retrying, state=TaskState.RETRYING)
    set_columns(app, elsewhere, namespace=f"{ns}-other")
    await claimed(app, running)
    await store.commit_results([FinalWrite(await claimed(app, done), "1")], now=now)
    assert await store.defer_deliveries(ns, [Deferral(superseded, 0, 0, now)], now=now) == 1

    def due(seconds: int) -> datetime:
        return now + timedelta(seconds=seconds)

    batch = [
        Deferral(retrying, 0, 0, due(30)),
        Deferral(pending, 0, 0, due(10)),
        Deferral(pending, 0, 0, due(99)),  # named twice: moves once, at its first time
        Deferral(enqueued, 0, 0, due(20)),
        Deferral(superseded, 0, 0, due(40)),  # its delivery 1 is the current one
        Deferral(pending, 0, 1, due(50)),  # a delivery this call makes names no entry yet
        Deferral(pending, 1, 0, due(60)),  # a generation the task never had
        Deferral(running, 0, 0, due(70)),
        Deferral(done, 0, 0, due(80)),
        Deferral(elsewhere, 0, 0, due(90)),  # another namespace's task
        Deferral("no-such-task", 0, 0, due(90)),
    ]
    assert await store.defer_deliveries(ns, batch, now=now) == 3
    states = {
        i: (task_row(app, i).state, task_row(app, i).delivery, task_row(app, i).attempt)
        for i in (pending, enqueued, retrying, superseded, running, done, elsewhere)
    }
    assert states == {
        pending: (TaskState.PENDING, 1, 0),
        enqueued: (TaskState.PENDING, 1, 0),
        retrying: (TaskState.PENDING, 1, 0),
        superseded: (TaskState.PENDING, 1, 0),
        running: (TaskState.RUNNING, 0, 1),
        done: (TaskState.SUCCEEDED, 0, 1),
        elsewhere: (TaskState.PENDING, 0, 0),
    }
    for task_id, seconds in ((pending, 10), (enqueued, 20), (retrying, 30)):
        assert outbox_rows(app, task_id)[-1] == (OutboxState.PENDING, 0, 1)
        assert abs(last_due(app, task_id) - due(seconds).replace(tzinfo=None)) < timedelta(seconds=1)
    assert len(outbox_rows(app, superseded)) == 2
    for task_id in (running, done, elsewhere):
        assert [row[1:] for row in outbox_rows(app, task_id)] == [(0, 0)]


async def test_a_batch_costs_the_statements_of_one_deferral(app: App) -> None:
    """A gate refusing a whole read batch (a busy key) is a fixed number of statements, not three
    per delivery: a task deferred dozens of times stays cheap, and the transaction short."""
    store, ns, now = app.runtime.store, app.settings.namespace, app.clock()
    one, *batch = submit(app, 41)
    counts = []
    for ids in ([one], batch):
        rows = [Deferral(i, 0, 0, now + timedelta(seconds=n)) for n, i in enumerate(ids)]
        with statements_on(store.engine, lambda sql: not sql.lstrip().upper().startswith("BEGIN")) as seen:
            assert await store.defer_deliveries(ns, rows, now=now) == len(ids)
        counts.append(len(seen))
    assert counts[1] == counts[0] <= 5, counts
