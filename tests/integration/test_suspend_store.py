"""The store's suspension, on every database: the waits' rows in one INSERT, looked for only
where a row may be there already (a child found rather than created, a signal), and a
suspension that finds everything it waits for settled redelivers its task at once."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.journal import PendingChild, PendingSignal, PreparedChild, StepKind, Suspended, signal_slot
from durable_tasks.records import tasks_table
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.store.journal import child_task
from durable_tasks.store.results import FinalWrite
from durable_tasks.store.submit import NewTask
from tests.helpers import statements_on

pytestmark = pytest.mark.anyio


def waiter_app(app: App) -> App:
    @app.task(name="double", queue="jobs")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    @app.task(name="waiter", queue="jobs")
    async def waiter(ctx: TaskContext[int], n: int) -> int:  # never run here: its claims are the test's
        return n

    return app


async def claim(app: App, task_id: str, delivery: int = 0) -> ExecutionClaim:
    [claimed] = await app.runtime.store.claim_executions(
        app.settings.namespace,
        [ClaimRequest(task_id, 0, delivery)],
        worker_id="w",
        now=app.clock(),
        lease=timedelta(seconds=30),
    )
    assert isinstance(claimed, ExecutionClaim)
    return claimed


async def claimed_parent(app: App) -> ExecutionClaim:
    with Session(app.engine) as s:
        parent_id = app.submit(s, "waiter", 1).id
        s.commit()
    return await claim(app, parent_id)


async def waiting_on_a_claimed_child(app: App) -> tuple[ExecutionClaim, ExecutionClaim]:
    """A parent's execution suspended on one child (``double`` of 3), and that child's claim."""
    parent = await claimed_parent(app)
    pending = pending_child("child:0", 3)
    rows = [(pending, child_task(parent, pending, queue="jobs", max_attempts=3))]
    suspended = await app.runtime.store.suspend(parent, rows, [], now=app.clock())
    assert suspended is not None
    [(_, outcome)] = suspended.created
    return parent, await claim(app, outcome.task_id)


def pending_child(slot: str, n: int) -> PendingChild:
    return PendingChild(slot, "double", PreparedChild("double", str(n)), (0, 0))


def pending_signal(name: str) -> PendingSignal:
    return PendingSignal(signal_slot(name), name, StepKind.SIGNAL, None, (0, 1))


def writes_steps(statement: str) -> bool:
    return statement.lstrip().upper().startswith("INSERT INTO DT_STEPS")


def reads_steps(statement: str) -> bool:
    return statement.lstrip().upper().startswith("SELECT") and "FROM dt_steps" in statement


async def test_new_waits_are_one_insert_and_the_task_waits_without_a_look_for_open_ones(app: App) -> None:
    parent = await claimed_parent(waiter_app(app))
    children = [(pending_child(f"child:{i}", i), None) for i in range(3)]
    rows = [(child, child_task(parent, child, queue="jobs", max_attempts=3)) for child, _ in children]
    with statements_on(app.engine) as seen:
        done = await app.runtime.store.suspend(parent, rows, [pending_signal("go")], now=app.clock())
    assert done is not None
    assert done.state is Suspended.WAITING
    assert len(done.created) == 3
    assert len([st for st in seen if writes_steps(st)]) == 1, seen
    # one look, for the signal's slot (a signal may be delivered before its wait); none for open waits
    assert len([st for st in seen if reads_steps(st)]) == 1, seen
    if (
        app.engine.dialect.name == "postgresql"
    ):  # the fence and the attempt's close, the 3 children, the look, the waits
        assert len([st for st in seen if not st.lstrip().upper().startswith("BEGIN")]) == 4, seen
    assert app.get_task(parent.task_id).state is TaskState.WAITING
    steps = app.steps(parent.task_id)
    assert [(st.kind, st.done) for st in steps] == [("child", False)] * 3 + [("signal", False)]
    assert [st.child_task_id for st in steps[:3]] == [outcome.task_id for _, outcome in done.created]


async def test_a_suspension_finds_the_child_an_earlier_try_created_beside_the_one_it_creates(app: App) -> None:
    """A retried suspension's children: the one an earlier try created is found by its key (not
    created again, not published again), the new one created, each linked to its slot, in the
    children's order (on PostgreSQL both in the children's one statement)."""
    parent = await claimed_parent(waiter_app(app))
    earlier, new = pending_child("child:0", 1), pending_child("child:1", 2)
    rows = [(p, child_task(parent, p, queue="jobs", max_attempts=3)) for p in (earlier, new)]
    with Session(app.engine) as s:
        earlier_id = app.runtime.store.submit(s, rows[0][1], app.clock()).task_id
        s.commit()
    done = await app.runtime.store.suspend(parent, rows, [], now=app.clock())
    assert done is not None
    assert done.state is Suspended.WAITING
    [(task, outcome)] = done.created
    assert (task.parent_slot, outcome.created) == ("child:1", True)
    steps = {st.slot: st.child_task_id for st in app.steps(parent.task_id)}
    assert steps == {"child:0": earlier_id, "child:1": outcome.task_id}
    with app.engine.connect() as conn:
        link = conn.execute(
            sa.select(tasks_table.c.parent_id, tasks_table.c.parent_generation, tasks_table.c.parent_slot).where(
                tasks_table.c.id == outcome.task_id
            )
        ).one()
    assert tuple(link) == (parent.task_id, parent.generation, "child:1")


async def test_a_suspension_on_children_alone_is_one_statement_on_postgres(app: App) -> None:
    """The fence, the children and their waits: one statement on PostgreSQL (BEGIN apart),
    whatever the number of children; the task waits, each child linked to its slot."""
    parent = await claimed_parent(waiter_app(app))
    rows = [(p, child_task(parent, p, queue="jobs", max_attempts=3)) for p in map(pending_child, ["a", "b"], [1, 2])]
    with statements_on(app.engine, keep=lambda st: not st.lstrip().upper().startswith("BEGIN")) as seen:
        done = await app.runtime.store.suspend(parent, rows, [], now=app.clock())
    assert done is not None
    assert (done.state, len(done.created)) == (Suspended.WAITING, 2)
    if app.engine.dialect.name == "postgresql":
        assert len(seen) == 1, seen
    assert app.get_task(parent.task_id).state is TaskState.WAITING
    steps = {st.slot: (st.kind, st.done, st.child_task_id) for st in app.steps(parent.task_id)}
    created = [outcome.task_id for _, outcome in done.created]
    assert steps == {slot: ("child", False, task_id) for slot, task_id in zip("ab", created, strict=True)}


async def an_earlier_child_that_ended(app: App, parent: ExecutionClaim) -> tuple[PendingChild, NewTask, str]:
    """An earlier suspension's child of ``parent`` (the same slot, so the same idempotency key),
    which has run and ended since (result 6): its pending child, its row, its id."""
    child = pending_child("child:0", 3)
    task = child_task(parent, child, queue="jobs", max_attempts=3)
    with Session(app.engine) as s:
        child_id = app.runtime.store.submit(s, task, app.clock()).task_id
        s.commit()
    await app.runtime.store.commit_results([FinalWrite(await claim(app, child_id), "6")], now=app.clock())
    return child, task, child_id


async def test_a_suspension_on_a_child_that_ended_since_an_earlier_try_redelivers_at_once(app: App) -> None:
    """Its only child was created by an earlier suspension and has ended: the slot settles
    with the child's result and the task goes back to PENDING with a new delivery."""
    parent = await claimed_parent(waiter_app(app))
    child, task, child_id = await an_earlier_child_that_ended(app, parent)
    done = await app.runtime.store.suspend(parent, [(child, task)], [], now=app.clock())
    assert done is not None
    assert (done.state, done.created) == (Suspended.REDELIVERED, ())
    found = app.get_task(parent.task_id)
    assert (found.state, found.delivery) == (TaskState.PENDING, 1)
    [step] = app.steps(parent.task_id)
    assert (step.child_task_id, step.done, step.result) == (child_id, True, "6")


async def test_a_suspension_of_an_attempt_that_lost_its_task_writes_nothing(app: App) -> None:
    parent = await claimed_parent(waiter_app(app))
    stale = dataclasses.replace(parent, attempt=parent.attempt + 1)
    rows = [(p, child_task(stale, p, queue="jobs", max_attempts=3)) for p in map(pending_child, ["a", "b"], [1, 2])]
    assert await app.runtime.store.suspend(stale, rows, [], now=app.clock()) is None
    assert app.get_task(parent.task_id).state is TaskState.RUNNING
    assert app.steps(parent.task_id) == []
    with app.engine.connect() as conn:
        children = conn.execute(sa.select(sa.func.count()).where(tasks_table.c.parent_id == parent.task_id))
        assert children.scalar_one() == 0


async def test_a_reaper_that_saw_a_suspended_task_running_neither_redelivers_nor_dead_letters_it(app: App) -> None:
    """A worker past its lease (a slow heartbeat) suspends its task between a reaper's read
    of the task (running, lease expired) and that reaper's write: the task waits for its
    signal, owes no entry (its resume makes a delivery), and stays waiting."""
    parent = await claimed_parent(waiter_app(app))
    store, ns = app.runtime.store, app.settings.namespace
    done = await store.suspend(parent, [], [pending_signal("go")], now=app.clock())
    assert done is not None
    assert done.state is Suspended.WAITING
    later = app.clock() + timedelta(minutes=5)  # the suspended attempt's lease long over
    key = (parent.task_id, parent.generation, parent.delivery)
    assert await store.redeliver_lost(ns, [key], now=later, reason="worker lost") == [False]
    assert await store.redeliver_lost(ns, [key], now=later, reason="entry gone", count_reclaim=False) == [False]
    dead = await store.dead_letter_task(
        ns, task_id=key[0], generation=key[1], delivery=key[2], now=later, reason="lost 3 deliveries"
    )
    assert not dead
    found = app.get_task(parent.task_id)
    assert (found.state, found.delivery) == (TaskState.WAITING, 0)
    assert app.signal(parent.task_id, "go", {"ok": True})  # it resumes as it would have
    assert (app.get_task(parent.task_id).state, app.get_task(parent.task_id).delivery) == (TaskState.PENDING, 1)


async def test_a_suspension_that_finds_its_child_ended_and_its_signal_delivered_redelivers_at_once(
    app: App,
) -> None:
    parent = await claimed_parent(waiter_app(app))
    child, task, child_id = await an_earlier_child_that_ended(app, parent)
    assert app.signal(parent.task_id, "go", {"ok": True})  # delivered before the wait opens

    done = await app.runtime.store.suspend(parent, [(child, task)], [pending_signal("go")], now=app.clock())
    assert done is not None
    assert (done.state, done.created) == (Suspended.REDELIVERED, ())
    found = app.get_task(parent.task_id)
    assert (found.state, found.delivery) == (TaskState.PENDING, 1)
    steps = {st.kind: st for st in app.steps(parent.task_id)}
    assert (steps["child"].child_task_id, steps["child"].done, steps["child"].result) == (child_id, True, "6")
    assert (steps["signal"].done, steps["signal"].result) == (True, '{"ok": true}')


async def test_a_recorded_step_is_fenced_and_its_first_result_wins(app: App) -> None:
    """A step's result is written under the attempt's fence, which extends its lease: a slot
    that has a row keeps it (a retried attempt replays it), and an attempt that no longer owns
    the task writes nothing. PostgreSQL does it in one statement."""
    run = await claimed_parent(waiter_app(app))
    store, now, lease = app.runtime.store, app.clock(), timedelta(minutes=5)
    leased = lease_of(app, run.task_id)  # the claim's, 30 s
    with statements_on(app.engine, keep=lambda st: not st.lstrip().upper().startswith("BEGIN")) as seen:
        assert await store.record_step(run, "model:0", "model", '"first"', now=now, lease=lease) == '"first"'
    assert len(seen) == (1 if app.engine.dialect.name == "postgresql" else 2), seen
    assert lease_of(app, run.task_id) > leased
    assert await store.record_step(run, "model:0", "model", '"again"', now=now, lease=lease) == '"first"'
    stale = dataclasses.replace(run, attempt=run.attempt + 1)
    assert await store.record_step(stale, "model:1", "model", '"stale"', now=now, lease=lease) is None
    assert [(st.slot, st.kind, st.done, st.result) for st in app.steps(run.task_id)] == [
        ("model:0", "step", True, '"first"')
    ]


def lease_of(app: App, task_id: str) -> Any:
    with app.engine.connect() as conn:
        return conn.execute(sa.select(tasks_table.c.lease_expires_at).where(tasks_table.c.id == task_id)).scalar_one()


async def test_a_childs_result_settles_its_parent_and_its_commit_locks_both_rows_itself(app: App) -> None:
    """A child's result without a hook resumes its parent in the same transaction. PostgreSQL's
    group commit locks the parent's row with the child's (one pass, id order), so the result
    and the settle with its resume are two statements, with no lock of their own before them."""
    parent, child = await waiting_on_a_claimed_child(waiter_app(app))
    with statements_on(app.engine, keep=lambda st: not st.lstrip().upper().startswith("BEGIN")) as seen:
        await app.runtime.store.commit_results([FinalWrite(child, "6")], now=app.clock())
    if app.engine.dialect.name == "postgresql":
        assert len(seen) == 2, seen
    resumed = app.get_task(parent.task_id)
    assert (resumed.state, resumed.delivery) == (TaskState.PENDING, 1)
    assert [(st.slot, st.done, st.result) for st in app.steps(parent.task_id)] == [("child:0", True, "6")]
