"""Task rows are locked in id order by every transaction that locks several: a child's final
transaction takes its parent's row in the same pass as its own, first. Locking the child's
row, then the parent's in a later statement, deadlocked with a dispatcher marking the
parent's resume and a later child of it in one pass (the dispatcher held the parent and
waited for the child). And two writes of one step's slot meet at their task's row: the one
that waited returns what the first wrote. On the databases with row locks."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, TaskState
from durable_tasks.records import tasks_table
from durable_tasks.store import ids, journal
from durable_tasks.store.execution import ExecutionClaim
from durable_tasks.store.journal import child_task
from durable_tasks.store.results import FinalWrite
from tests.helpers import statements_on, task_row
from tests.integration.test_store import claimed, new_task
from tests.integration.test_suspend_store import claimed_parent, pending_child, waiter_app, waiting_on_a_claimed_child

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["postgres", "mysql"], indirect=True)]

t = tasks_table.c


def blocked_by(conn: sa.Connection, locking: str = "%FOR UPDATE%") -> int:
    """How many transactions wait for a lock that ``conn``'s transaction holds (PostgreSQL),
    or run a locking statement (SQL ``LIKE locking``) in this test's database (MySQL/MariaDB,
    where nothing else runs one here, so it waits; MariaDB's lock-wait tables can leave out a
    waiting transaction), read on a connection of its own."""
    if conn.dialect.name == "postgresql":
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        query, params = f"SELECT count(*) FROM pg_stat_activity WHERE {pid} = ANY(pg_blocking_pids(pid))", {}
    else:
        query = (
            "SELECT count(*) FROM information_schema.processlist"
            " WHERE db = DATABASE() AND id <> CONNECTION_ID() AND info LIKE :locking"
        )
        params = {"locking": locking}
    with conn.engine.connect() as probe:
        return int(probe.execute(sa.text(query), params).scalar_one())


def lock_nowait(conn: sa.Connection, task_id: str) -> None:
    conn.execute(sa.select(t.id).where(t.id == task_id).with_for_update(nowait=True)).one()


async def end_with_result(app: App, child: ExecutionClaim) -> None:
    await app.runtime.store.commit_results([FinalWrite(child, "6")], now=app.clock())


async def end_with_failure(app: App, child: ExecutionClaim) -> None:
    recorded = await app.runtime.store.record_failure(
        child, now=app.clock(), error_type="ValueError", error_message="no", retry_at=None
    )
    assert recorded is not None


async def end_with_cancel(app: App, child: ExecutionClaim) -> None:
    def cancel() -> None:
        with Session(app.engine) as s:
            assert app.cancel(s, child.task_id)
            s.commit()

    await anyio.to_thread.run_sync(cancel)


@pytest.mark.parametrize(
    "end", [end_with_result, end_with_failure, end_with_cancel], ids=["result", "failure", "cancel"]
)
async def test_a_childs_end_waits_for_its_parents_row_before_it_locks_its_own(
    make_app: Callable[..., App], end: Callable[[App, ExecutionClaim], Coroutine[Any, Any, None]]
) -> None:
    app = waiter_app(make_app())
    parent, child = await waiting_on_a_claimed_child(app)
    assert parent.task_id < child.task_id  # ids in time order: the dispatcher's mark locks the parent first

    with app.engine.connect() as dispatcher:  # as the dispatcher's mark: the parent's row first
        tx = dispatcher.begin()
        dispatcher.execute(sa.select(t.id).where(t.id == parent.task_id).with_for_update()).one()
        async with anyio.create_task_group() as tg:
            tg.start_soon(end, app, child)
            deadline = time.monotonic() + 10
            while not await anyio.to_thread.run_sync(blocked_by, dispatcher):  # the child's end waits for the parent
                assert time.monotonic() < deadline, "the child's end never waited for its parent's row"
                await anyio.sleep(0.01)
            lock_nowait(dispatcher, child.task_id)  # the child's row is free: the end holds nothing yet
            tx.commit()
    resumed = app.get_task(parent.task_id)
    assert (resumed.state, resumed.delivery) == (TaskState.PENDING, 1)  # its only child's end resumed it
    await app.aclose()


async def test_a_rerun_locks_its_task_and_its_childrens_rows_in_id_order(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun cancels the superseded generation's children: it takes their rows and its
    task's in id order, not in the journal's (slot) order, which a dispatcher's mark of two of
    them would meet in a cycle."""
    app = waiter_app(make_app())
    parent = await claimed_parent(app)
    later = itertools.count(time.time_ns() + 1_000_000, 1_000_000)  # each new id a millisecond later
    monkeypatch.setattr(ids, "_now_ns", lambda: next(later))
    late_slot, early_slot = pending_child("child:b", 1), pending_child("child:a", 2)
    rows = [(p, child_task(parent, p, queue="jobs", max_attempts=3)) for p in (late_slot, early_slot)]
    suspended = await app.runtime.store.suspend(parent, rows, [], now=app.clock())
    assert suspended is not None
    first, second = (outcome.task_id for _, outcome in suspended.created)  # created (and so ids) in this order
    assert parent.task_id < first < second  # and the journal, in slot order, holds second before first

    def rerun() -> None:
        with Session(app.engine) as s:
            assert app.rerun(s, parent.task_id) == 1
            s.commit()

    with app.engine.connect() as dispatcher:  # as the dispatcher's mark: the first child's row
        tx = dispatcher.begin()
        lock_nowait(dispatcher, first)
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, rerun)
            deadline = time.monotonic() + 10
            while not await anyio.to_thread.run_sync(blocked_by, dispatcher):  # the rerun waits for it
                assert time.monotonic() < deadline, "the rerun never waited for its first child's row"
                await anyio.sleep(0.01)
            lock_nowait(dispatcher, second)  # the later child's row is free: the rerun holds nothing past the first
            tx.commit()
    assert [app.get_task(c).state for c in (first, second)] == [TaskState.CANCELLED, TaskState.CANCELLED]
    await app.aclose()


async def test_a_step_recorded_while_its_fence_waited_for_the_row_returns_the_result_recorded_first(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writes of one step's slot meet at the task row, which the fence's UPDATE locks. The
    one that waited finds the slot taken once it has the row, and returns the result written
    first. On PostgreSQL the fence and the insert are one statement, whose snapshot predates
    the first write's commit: it reads the slot again, in a statement of its own."""
    app = waiter_app(make_app())
    run = await claimed_parent(app)
    now, lease = app.clock(), timedelta(minutes=5)
    read_again: list[str] = []
    recorded_result = journal.recorded_result

    def counted(conn: sa.Connection, claim: ExecutionClaim, slot: str) -> str:
        read_again.append(slot)
        return recorded_result(conn, claim, slot)

    monkeypatch.setattr(journal, "recorded_result", counted)
    returned: list[str | None] = []

    async def second() -> None:
        returned.append(await app.runtime.store.record_step(run, "model:0", "model", '"second"', now=now, lease=lease))

    with app.engine.connect() as first:
        tx = first.begin()
        assert journal.record_step(first, run, "model:0", "model", '"first"', now=now, lease=lease) == '"first"'
        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            deadline = time.monotonic() + 10
            while not await anyio.to_thread.run_sync(blocked_by, first, "UPDATE dt_tasks%"):
                assert time.monotonic() < deadline, "the second write never waited for the task row"
                await anyio.sleep(0.01)
            assert not returned
            tx.commit()
    assert returned == ['"first"']
    assert read_again == ["model:0"]
    assert [(st.slot, st.result) for st in app.steps(run.task_id)] == [("model:0", '"first"')]
    await app.aclose()


async def test_recording_held_attempts_starts_locks_their_rows_in_id_order_first(make_app: Callable[..., App]) -> None:
    """The starts of the attempts an isolation gate lets in together are one UPDATE of several
    task rows: it takes their locks in id order first, as a lease renewal or a group commit
    beside it does, whatever order the plan would visit them in."""
    app = make_app(clock=FrozenClock())
    with Session(app.engine) as session:
        task_ids = sorted(app.runtime.store.submit(session, new_task(app), app.clock()).task_id for _ in range(3))
        session.commit()
    claims = [await claimed(app, task_id, hold=True) for task_id in task_ids]
    with statements_on(app.engine, lambda sql: "dt_tasks" in sql) as seen:
        await app.runtime.store.mark_started(claims[::-1], now=app.clock())
    lock, update = seen
    assert "FOR UPDATE" in lock.upper(), lock
    assert "ORDER BY" in lock.upper(), lock
    assert update.lstrip().upper().startswith("UPDATE"), update
    assert all(task_row(app, task_id).started_at == app.clock() for task_id in task_ids)
    await app.aclose()
