"""The Store protocol, operation by operation, on every backend (the ``database_url`` fixture).

Each test drives a store through the protocol only (no loop, no Redis) with a frozen clock,
so a dialect's store that means something else than the others fails here first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, TaskState
from durable_tasks.records import AttemptOutcome, OutboxState, outbox_table, tasks_table
from durable_tasks.store import Store
from durable_tasks.store.execution import ClaimRefused, ClaimRequest, ExecutionClaim
from durable_tasks.store.outbox import ClaimedDelivery
from durable_tasks.store.recovery import DeadTask
from durable_tasks.store.results import CommitOutcome, FinalWrite
from durable_tasks.store.submit import NewTask
from tests.helpers import statements_on

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


@pytest.fixture
def app(make_app: Callable[..., App], clock: FrozenClock) -> App:
    return make_app(clock=clock)


def new_task(app: App, key: str | None = None, queue: str = "jobs") -> NewTask:
    return NewTask(
        namespace=app.settings.namespace,
        name="store.job",
        queue=queue,
        payload_json='{"n": 1}',
        idempotency_key=key,
        max_attempts=3,
        traceparent=None,
        shadow=False,
    )


def submit(app: App, n: int = 1, **kwargs: str) -> list[str]:
    with Session(app.engine) as session:
        ids = [app.runtime.store.submit(session, new_task(app, **kwargs), app.clock()).task_id for _ in range(n)]
        session.commit()
    return ids


def outbox_rows(app: App, task_id: str) -> list[tuple[str, int, int]]:
    o = outbox_table.c
    with app.runtime.store.read_engine.connect() as conn:
        rows = conn.execute(sa.select(o.state, o.generation, o.delivery).where(o.task_id == task_id).order_by(o.id))
        return [(r.state, r.generation, r.delivery) for r in rows]


async def lease(app: App) -> list[ClaimedDelivery]:
    return await app.runtime.store.lease_outbox(
        app.settings.namespace, now=app.clock(), lease=LEASE, limit=100, watermark=None
    )


async def claim(
    app: App, task_id: str, generation: int = 0, delivery: int = 0, *, hold: bool = False
) -> ExecutionClaim | ClaimRefused:
    [answer] = await app.runtime.store.claim_executions(
        app.settings.namespace,
        [ClaimRequest(task_id, generation, delivery)],
        worker_id="w",
        now=app.clock(),
        lease=LEASE,
        hold=hold,
    )
    return answer


async def claimed(app: App, task_id: str, delivery: int = 0, *, hold: bool = False) -> ExecutionClaim:
    answer = await claim(app, task_id, 0, delivery, hold=hold)
    assert isinstance(answer, ExecutionClaim)
    return answer


async def test_submit_writes_one_task_per_idempotency_key_and_keys_are_case_sensitive(app: App) -> None:
    first, again = submit(app, 2, key="CaseKey")
    [other] = submit(app, key="casekey")
    assert first == again != other
    assert outbox_rows(app, first) == [(OutboxState.PENDING, 0, 0)]
    assert app.get_task(first).state == TaskState.PENDING


async def test_rerun_and_cancel_in_the_callers_transaction(app: App) -> None:
    store, ns = app.runtime.store, app.settings.namespace
    [task_id] = submit(app)
    with Session(app.engine) as session:
        assert store.rerun(session, ns, task_id, app.clock()) == 1
        assert store.rerun(session, ns, "no-such-task", app.clock()) is None
        session.commit()
    assert outbox_rows(app, task_id)[-1] == (OutboxState.PENDING, 1, 0)
    with Session(app.engine) as session:
        assert store.cancel(session, ns, task_id, app.clock()) is True
        assert store.cancel(session, ns, task_id, app.clock()) is False
        assert store.cancel(session, ns, "no-such-task", app.clock()) is None
        session.commit()
    assert app.get_task(task_id).state == TaskState.CANCELLED
    assert {state for state, _, _ in outbox_rows(app, task_id)} == {OutboxState.DEAD}


async def test_a_lease_hides_rows_until_it_runs_out_and_settling_fences_by_token(app: App, clock: FrozenClock) -> None:
    store = app.runtime.store
    sent_id, dead_id, retry_id, held_id = submit(app, 4)
    rows = {row.task_id: row for row in await lease(app)}
    assert set(rows) == {sent_id, dead_id, retry_id, held_id}
    assert await lease(app) == []  # leased: no other dispatcher gets them
    now = app.clock()
    marked = await store.settle_outbox(
        sent=[(rows[sent_id], "1-0", None)],
        dead=[(rows[dead_id], "invalid payload")],
        retry=[(rows[retry_id], now + timedelta(seconds=5), "redis down")],
        held=[rows[held_id]],
        now=now,
        release_at=now + timedelta(seconds=2),
    )
    assert marked == 1
    assert app.get_task(sent_id).state == TaskState.ENQUEUED
    assert app.get_task(dead_id).state == TaskState.DEAD
    assert outbox_rows(app, dead_id) == [(OutboxState.DEAD, 0, 0)]
    # A stale claim token changes nothing: the row was settled by this pass already.
    assert await store.settle_outbox(sent=[(rows[sent_id], "2-0", None)], dead=[], retry=[], held=[], now=now,
                                     release_at=now) == 0  # fmt: skip
    clock.advance(timedelta(seconds=3))
    assert [row.task_id for row in await lease(app)] == [held_id]  # released at +2 s, retry due at +5 s
    clock.advance(timedelta(seconds=3))
    [again] = await lease(app)
    assert (again.task_id, again.attempts) == (retry_id, 1)


async def test_a_lease_says_which_payloads_were_written_without_their_size(app: App) -> None:
    """A task written by ``dt_submit`` (or code before schema 15) has no ``payload_bytes``: its
    JSON is not the encoder's, so the dispatcher checks it for duplicate keys; not the others'."""
    mine, foreign = submit(app, 2)
    t = tasks_table.c
    with app.engine.begin() as conn:
        conn.execute(sa.update(tasks_table).where(t.id == foreign).values(payload_bytes=None))
    assert {row.task_id: row.foreign_json for row in await lease(app)} == {mine: False, foreign: True}


async def test_the_usual_pass_marks_every_row_sent_in_one_go(app: App) -> None:
    ids = submit(app, 3)
    rows = await lease(app)
    now = app.clock()
    sent = [(row, f"{i}-0", None) for i, row in enumerate(rows)]
    assert await app.runtime.store.settle_outbox(sent=sent, dead=[], retry=[], held=[], now=now, release_at=now) == 3
    assert {app.get_task(i).state for i in ids} == {TaskState.ENQUEUED}


async def test_each_row_of_a_pass_is_fenced_by_its_own_token_and_gets_its_own_entry_id(app: App) -> None:
    ids = submit(app, 3)
    rows = await lease(app)
    stale = dataclasses.replace(rows[1], claim_token="an earlier lease's")
    now = app.clock()
    sent = [(row, f"{i}-7", i) for i, row in enumerate([rows[0], stale, rows[2]])]
    assert await app.runtime.store.settle_outbox(sent=sent, dead=[], retry=[], held=[], now=now, release_at=now) == 2
    o = outbox_table.c
    with app.runtime.store.read_engine.connect() as conn:
        mine = sa.select(outbox_table).where(o.namespace == app.settings.namespace)
        marks = {r.task_id: (r.state, r.stream_id, r.partition) for r in conn.execute(mine)}
    assert set(marks) == set(ids)
    assert [marks[row.task_id] for row in rows] == [
        (OutboxState.SENT, "0-7", 0),
        (OutboxState.PENDING, None, None),
        (OutboxState.SENT, "2-7", 2),
    ]
    # Each task was published all the same (one entry per delivery, deduplicated): ENQUEUED.
    assert {app.get_task(task_id).state for task_id in ids} == {TaskState.ENQUEUED}


async def test_a_claim_is_the_execution_fence(app: App, clock: FrozenClock) -> None:
    store, ns = app.runtime.store, app.settings.namespace
    [task_id] = submit(app)
    first = await claimed(app, task_id)  # PENDING is claimable: the entry may beat the mark
    assert (first.attempt, first.generation, first.worker_id) == (1, 0, "w")
    assert await claim(app, task_id) is ClaimRefused.STALE  # held by a live lease
    assert await claim(app, "no-such-task") is ClaimRefused.NO_TASK
    duplicate = await store.claim_executions(
        ns, [ClaimRequest("no-such-task", 0, 0)] * 2, worker_id="w", now=app.clock(), lease=LEASE
    )
    assert duplicate == [ClaimRefused.NO_TASK, ClaimRefused.NO_TASK]
    clock.advance(LEASE + timedelta(seconds=1))
    second = await claimed(app, task_id)  # the lease ran out: a new attempt
    assert second.attempt == 2
    outcomes = [a.outcome for a in app.get_task(task_id).attempts]
    assert outcomes == [AttemptOutcome.LOST, None]


async def test_a_reruns_claim_links_its_earlier_attempt_and_closes_what_a_lost_worker_left_open(
    app: App, clock: FrozenClock
) -> None:
    """A re-run's claim reads the trace context of the task's latest earlier attempt (its new
    attempt's span links to it) and closes that attempt as lost; PostgreSQL's claim statement
    does both itself, with nothing sent on the App's engine."""
    store, ns = app.runtime.store, app.settings.namespace
    [task_id] = submit(app)
    earlier = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    [first] = await store.claim_executions(
        ns, [ClaimRequest(task_id, 0, 0, earlier)], worker_id="w", now=app.clock(), lease=LEASE
    )
    assert isinstance(first, ExecutionClaim)
    assert first.previous_traceparent is None
    clock.advance(LEASE + timedelta(seconds=1))  # its worker is lost
    with statements_on(app.engine) as seen:
        second = await claimed(app, task_id)
    assert (second.attempt, second.previous_traceparent) == (2, earlier)
    assert [(a.outcome, a.retry_reason) for a in app.get_task(task_id).attempts] == [
        (AttemptOutcome.LOST, "lease expired: worker lost"),
        (None, None),
    ]
    if app.engine.dialect.name == "postgresql":
        assert seen == []


async def test_a_group_commit_fences_each_result_and_runs_hooks_in_savepoints(app: App) -> None:
    store, ns = app.runtime.store, app.settings.namespace
    ok_id, stale_id, hooked_id, broken_id = submit(app, 4)
    ok, stale, hooked, broken = [await claimed(app, i) for i in (ok_id, stale_id, hooked_id, broken_id)]
    with Session(app.engine) as session:
        store.rerun(session, ns, stale_id, app.clock())
        session.commit()
    seen: list[str] = []

    def explode(conn: sa.Connection) -> None:
        raise RuntimeError("hook broke")

    writes = [
        FinalWrite(ok, "1"),
        FinalWrite(stale, "2"),
        FinalWrite(hooked, "3", hook=lambda conn: seen.append("hook")),
        FinalWrite(broken, "4", hook=explode),
    ]
    await store.commit_results(writes, now=app.clock())
    assert [w.outcome for w in writes] == [
        CommitOutcome.COMMITTED,
        CommitOutcome.FENCED_OUT,
        CommitOutcome.COMMITTED,
        CommitOutcome.HOOK_FAILED,
    ]
    assert seen == ["hook"]
    assert (app.get_task(ok_id).state, app.get_task(ok_id).result) == (TaskState.SUCCEEDED, 1)
    assert app.get_task(hooked_id).result == 3
    assert app.get_task(broken_id).state == TaskState.RUNNING  # rolled back to its savepoint
    assert [a.outcome for a in app.get_task(ok_id).attempts] == [AttemptOutcome.SUCCEEDED]
    assert app.get_task(stale_id).attempts[0].outcome == AttemptOutcome.FENCED_OUT


async def test_a_failure_retries_through_a_new_delivery_or_fails_with_its_hook(app: App) -> None:
    store = app.runtime.store
    retried_id, final_id = submit(app, 2)
    retried, final = await claimed(app, retried_id), await claimed(app, final_id)
    now = app.clock()
    assert await store.record_failure(
        retried, now=now, error_type="ValueError", error_message="bad", retry_at=now + timedelta(seconds=1)
    )
    assert app.get_task(retried_id).state == TaskState.RETRYING
    assert outbox_rows(app, retried_id)[-1] == (OutboxState.PENDING, 0, 1)
    hooks: list[str] = []
    assert await store.record_failure(
        final,
        now=now,
        error_type="ValueError",
        error_message="bad",
        retry_at=None,
        on_failed=lambda c: hooks.append("x"),
    )
    assert (app.get_task(final_id).state, hooks) == (TaskState.FAILED, ["x"])
    # fenced: the attempt is no longer current
    assert not await store.record_failure(final, now=now, error_type="E", error_message="late", retry_at=None)


async def test_leases_are_renewed_only_for_attempts_still_held(app: App, clock: FrozenClock) -> None:
    store = app.runtime.store
    held_id, done_id = submit(app, 2)
    held, done = await claimed(app, held_id), await claimed(app, done_id)
    await store.commit_results([FinalWrite(done, "0")], now=app.clock())
    assert await store.renew_leases([held, done], now=app.clock(), lease=LEASE) == {held_id}
    assert await store.heartbeat(held, now=app.clock(), lease=LEASE)
    assert not await store.heartbeat(done, now=app.clock(), lease=LEASE)
    await store.mark_solo(held, now=app.clock())
    clock.advance(LEASE * 2)
    view = (await store.lease_views(app.settings.namespace, [held_id, "no-such-task"]))[held_id]
    assert (view.state, view.loss_counts) == (TaskState.RUNNING, True)  # it ran alone: its own loss


async def test_the_reaper_redelivers_dead_letters_and_finds_unconfirmed_deliveries(
    app: App, clock: FrozenClock
) -> None:
    store, ns = app.runtime.store, app.settings.namespace
    lost_id, dead_id = submit(app, 2)
    rows = await lease(app)
    await store.settle_outbox(
        sent=[(row, f"{i}-0", None) for i, row in enumerate(rows)], dead=[], retry=[], held=[], now=app.clock(),
        release_at=app.clock(),
    )  # fmt: skip
    clock.advance(timedelta(minutes=1))
    unconfirmed = await store.unconfirmed_deliveries(ns, now=app.clock(), grace=timedelta(seconds=30), limit=10)
    assert {u.task_id for u in unconfirmed.deliveries} == {lost_id, dead_id}
    assert unconfirmed.cursor is None  # a short page: the walk starts over
    assert await store.redeliver(
        ns, task_id=lost_id, generation=0, delivery=0, now=app.clock(), reason="lost", count_reclaim=True
    )
    assert not await store.redeliver(  # the old delivery is stale now
        ns, task_id=lost_id, generation=0, delivery=0, now=app.clock(), reason="lost", count_reclaim=True
    )
    # Never claimed, so none of its code ran: redelivered, not made a suspect.
    assert (app.get_task(lost_id).delivery, app.get_task(lost_id).reclaims) == (1, 0)
    told: list[DeadTask] = []
    assert await store.dead_letter_task(
        ns,
        task_id=dead_id,
        generation=0,
        delivery=0,
        now=app.clock(),
        reason="poison",
        on_dead=lambda conn, task: told.append(task),
    )
    assert [(t.id, t.name, t.generation) for t in told] == [(dead_id, "store.job", 0)]
    assert app.get_task(dead_id).state == TaskState.DEAD


async def test_backlogs_facts_and_prune(app: App, clock: FrozenClock) -> None:
    store, ns = app.runtime.store, app.settings.namespace
    submit(app, 2)
    submit(app, queue="other")
    backlogs = await store.queue_backlogs(ns)
    assert {q: b.outbox_backlog for q, b in backlogs.items()} == {"jobs": 2, "other": 1}
    facts = await store.facts()
    assert facts.indexes_missing == []
    clock.advance(timedelta(days=30))
    assert store.prune(ns, before=app.clock(), batch=10, max_batches=10).tasks == 0  # nothing final
    assert store.load_task(ns, "no-such-task") is None
    waiter = store.outbox_waiter(ns)
    await waiter.wait(timedelta(0))
    await waiter.aclose()


def test_the_store_is_one_of_the_protocol(app: App) -> None:
    store: Store = app.runtime.store
    assert store.engine is app.engine
