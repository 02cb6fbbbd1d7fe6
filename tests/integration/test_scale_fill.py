"""benchmarks/scale_fill: the rows bench_scale makes by SQL are rows the runtime reads as its own,
on every backend (a history it prunes, a backlog it dispatches and drains), in chunks."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from benchmarks import scale_fill
from durable_tasks import App, TaskContext, TaskState
from durable_tasks.records import attempts_table, outbox_table, tasks_table
from durable_tasks.store.ids import new_task_id

pytestmark = pytest.mark.anyio


def rows(app: App, table: sa.Table, *where: Any) -> list[Any]:
    with app.runtime.store.read_engine.connect() as conn:
        return list(conn.execute(sa.select(table).where(table.c.namespace == app.settings.namespace, *where)))


def with_noop(app: App) -> App:
    @app.task(name="scale.noop", queue="scale")
    def noop(ctx: TaskContext[int], n: int) -> int:
        return n

    return app


async def test_a_history_is_finished_work_the_runtime_reads_and_prunes(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scale_fill, "CHUNK", 100)  # three chunks and a part
    app = with_noop(make_app())
    scale_fill.fill_history(app, app.settings.namespace, 345)
    tasks = rows(app, tasks_table)
    assert len(tasks) == 345
    assert len({t.id for t in tasks}) == 345
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    assert len(rows(app, attempts_table, attempts_table.c.outcome == "succeeded")) == 345
    assert len(rows(app, outbox_table, outbox_table.c.state == "SENT")) == 345
    one = app.get_task(tasks[0].id)  # read back through the runtime's own types
    assert one.result == one.payload  # JSON the codec decodes
    assert len(one.attempts) == 1
    assert one.finished_at is not None
    assert one.started_at is not None
    assert one.started_at < one.finished_at
    age = datetime.now(UTC) - one.finished_at
    assert timedelta(days=10) - timedelta(minutes=5) <= age <= timedelta(days=40) + timedelta(minutes=5)
    report = app.prune(timedelta(days=7), batch=100)
    assert (report.tasks, report.attempts, report.outbox_rows) == (345, 345, 345)


@pytest.mark.parametrize("random_ids", [False, True])
def test_a_historys_ids_are_uuidv7s_in_time_order_or_random_on_request(
    make_app: Callable[..., App], random_ids: bool
) -> None:
    """Time-ordered ids are what submit writes (store/ids.py): a prune of the oldest tasks then
    finds them together at the low end of the key. Random ones are the harder case, on request."""
    app = make_app()
    scale_fill.fill_history(app, app.settings.namespace, 200, random_ids=random_ids)
    tasks = rows(app, tasks_table)
    by_time = [t.id for t in sorted(tasks, key=lambda t: t.created_at)]
    assert len(set(by_time)) == 200
    assert (by_time == sorted(by_time)) is not random_ids
    assert all(uuid.UUID(i).version == 7 for i in by_time) is not random_ids
    if not random_ids:  # the id's timestamp is the creation time, to the millisecond
        first = min(tasks, key=lambda t: t.created_at)
        created = first.created_at if first.created_at.tzinfo else first.created_at.replace(tzinfo=UTC)
        id_ms = uuid.UUID(first.id).int >> 80
        assert abs(id_ms - created.timestamp() * 1000) <= 2
        assert by_time[-1] < new_task_id()  # older than any task submitted now


def test_the_last_tasks_of_a_10_000_000_task_history_are_ten_days_old(make_app: Callable[..., App]) -> None:
    """Each task's time comes from its place in the whole history: on MySQL that product once
    overflowed a BIGINT past 3.5 million rows, so the 10,000,000-row case could not be filled."""
    app = make_app()
    scale_fill.fill_tasks(app, app.settings.namespace, "history", 10_000_000, 9_999_990, 10_000_000)
    tasks = rows(app, tasks_table)
    assert sorted(int(t.payload) for t in tasks) == list(range(9_999_991, 10_000_001))
    newest = max(t.created_at for t in tasks)
    age = datetime.now(UTC) - (newest if newest.tzinfo else newest.replace(tzinfo=UTC))
    assert timedelta(days=10) - timedelta(minutes=5) <= age <= timedelta(days=10) + timedelta(minutes=5)


async def test_a_backlog_is_pending_work_the_runtime_dispatches_and_drains(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scale_fill, "CHUNK", 100)
    app = with_noop(make_app())
    scale_fill.fill_backlog(app, app.settings.namespace, 250)
    tasks = rows(app, tasks_table)
    assert len({t.id for t in tasks}) == 250
    assert [t.id for t in sorted(tasks, key=lambda t: int(t.payload))] == sorted(t.id for t in tasks)  # time order
    assert len(rows(app, outbox_table, outbox_table.c.state == "PENDING")) == 250
    while await app.dispatch_once():
        pass
    assert await app.work(max_tasks=250, timeout=timedelta(seconds=60)) == 250
    assert {t.state for t in rows(app, tasks_table)} == {TaskState.SUCCEEDED}
