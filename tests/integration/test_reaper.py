"""The reaper and the reconciler against real Redis and real databases.

A "dead worker" is simulated with the runtime's own primitives: the entry is read through the
consumer group under a consumer name that then never acknowledges it (and, when the scenario
says so, the execution fence is taken with ``claim_execution`` and never released). Time is
made to pass, not waited for: every App here runs on a FrozenClock that moves database leases,
and ``XCLAIM ... IDLE`` makes a Redis entry look idle (tests.helpers.outlive_lease, make_idle).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, FrozenClock, Task, TaskContext, TaskInfo, TaskState, reaper
from durable_tasks.records import outbox_table, tasks_table
from durable_tasks.store.engine import read_only
from durable_tasks.store.payloads import ASIDE_PAYLOAD_BYTES
from durable_tasks.transport.keys import CONSUMER_GROUP
from durable_tasks.transport.messages import StreamEntry, parse_delivery
from tests.helpers import claim_entry, die_running_alone, make_idle, outlive_lease

pytestmark = pytest.mark.anyio

QUEUE = "reap"
TASK_NAME = "reaper.double"


class Job(BaseModel):
    n: int


def _register(app: App) -> Task[Job, Any]:
    @app.task(name=TASK_NAME, queue=QUEUE)
    def double(ctx: TaskContext[Job], p: Job) -> int:
        return p.n * 2

    return double


def _submit(app: App, task: Task[Job, Any], n: int) -> str:
    with Session(app.engine) as s:
        handle = task.submit(s, Job(n=n))
        s.commit()
    return handle.id


@pytest.fixture
def make_app(make_app: Callable[..., App]) -> Callable[..., App]:
    """Apps on a FrozenClock of their own (the ``app`` fixture's too)."""
    return lambda **overrides: make_app(**({"clock": FrozenClock()} | overrides))


def _past_lease(app: App) -> timedelta:
    """An idle time past the lease."""
    return app.settings.lease_timeout + timedelta(seconds=1)


def _redis(app: App) -> aioredis.Redis:
    client: aioredis.Redis = app.runtime.transport().client
    return client


def _stream(app: App) -> str:
    return app.runtime.transport().keys(QUEUE).stream


def _dlq(app: App) -> str:
    return app.runtime.transport().keys(QUEUE).dlq


async def _pending(app: App) -> int:
    summary = await _redis(app).xpending(_stream(app), CONSUMER_GROUP)
    return int(summary["pending"])


async def _xrange(app: App, key: str, *, start: str = "-") -> list[tuple[str, dict[str, str]]]:
    """XRANGE with the reply typed (the client decodes responses to str)."""
    reply = await _redis(app).xrange(key, min=start)
    return [(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for i, f in reply or []]


async def _read(app: App, consumer: str, count: int = 1) -> list[StreamEntry]:
    """XREADGROUP as ``consumer``: the entries become pending under that consumer's name."""
    entries = await app.runtime.transport().read([QUEUE], consumer, count=count, block=timedelta(milliseconds=100))
    assert len(entries) == count, entries
    return entries


def _outbox(app: App, task_id: str) -> list[tuple[int, str]]:
    o = outbox_table.c
    with read_only(app.engine).connect() as conn:
        rows = conn.execute(sa.select(o.delivery, o.state).where(o.task_id == task_id).order_by(o.id)).all()
    return [(r.delivery, r.state) for r in rows]


def _history(app: App, task_id: str) -> list[tuple[int, str | None]]:
    return [(a.attempt, a.outcome) for a in app.get_task(task_id).attempts]


async def _runs_to_success(app: App, task_id: str, result: int, history: list[tuple[int, str | None]]) -> TaskInfo:
    """Dispatch the task's pending delivery, run it, and check it succeeded with ``result``
    after ``history``; returns its state."""
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = app.get_task(task_id)
    assert info.state == TaskState.SUCCEEDED
    assert info.result == result
    assert _history(app, task_id) == history
    return info


@asynccontextmanager
async def _opened(app: App) -> AsyncIterator[App]:
    try:
        yield app
    finally:
        await app.aclose()


# -- lost workers ----------------------------------------------------------------------------


async def test_worker_lost_after_claim_is_redelivered_and_completes(app: App) -> None:
    double = _register(app)
    task_id = _submit(app, double, 21)
    assert await app.dispatch_once() == 1
    [entry] = await _read(app, "dead-worker")
    claim = await claim_entry(app, entry, "dead-worker")
    assert claim is not None
    assert claim.attempt == 1
    assert app.get_task(task_id).state == TaskState.RUNNING

    assert await outlive_lease(app) == 1  # the worker never heartbeats again
    report = await app.reap_once()

    assert report.redelivered == 1
    assert (report.kept, report.dead_lettered, report.reconciled) == (0, 0, 0)
    info = app.get_task(task_id)
    assert info.state == TaskState.PENDING
    assert (info.delivery, info.reclaims) == (1, 1)
    assert _outbox(app, task_id) == [(0, "SENT"), (1, "PENDING")]
    assert _history(app, task_id) == [(1, "lost")]
    lost = info.attempts[0]
    assert lost.worker_id == "dead-worker"
    assert lost.finished_at is not None
    assert lost.retry_reason
    assert await _pending(app) == 0  # the superseded entry was acknowledged

    # A second pass finds nothing more to do: no second redelivery, no extra outbox row.
    again = await app.reap_once()
    assert (again.redelivered, again.reconciled) == (0, 0)
    assert _outbox(app, task_id) == [(0, "SENT"), (1, "PENDING")]

    info = await _runs_to_success(app, task_id, 42, [(1, "lost"), (2, "succeeded")])
    assert info.attempts[1].delivery == 1
    assert info.attempts[1].worker_id != "dead-worker"
    assert _outbox(app, task_id) == [(0, "SENT"), (1, "SENT")]
    assert await _pending(app) == 0


@pytest.mark.parametrize(("max_deliveries", "acts"), [(3, "redeliver_lost"), (1, "dead_letter_task")])
async def test_a_worker_that_renews_its_lease_as_the_reaper_acts_keeps_its_entry(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch, max_deliveries: int, acts: str
) -> None:
    """The reaper read the task with its lease expired (a late heartbeat); the heartbeat lands
    before the reaper's redelivery (or, at its last delivery, its dead-lettering), which the
    live lease refuses. The entry stays pending: when that worker does die, the PEL scan finds
    it and counts the loss (acknowledged, it would be trimmed, and the loss would come back
    through the reconciler, uncounted)."""
    async with _opened(make_app(max_deliveries=max_deliveries)) as app:
        double = _register(app)
        task_id = _submit(app, double, 4)
        assert await app.dispatch_once() == 1
        [entry] = await _read(app, "slow-worker")
        claim = await die_running_alone(app, entry, "slow-worker")  # alone: its loss is its own
        store = app.runtime.store
        act = getattr(store, acts)
        renewed: list[bool] = []

        async def after_a_heartbeat(*args: Any, **kwargs: Any) -> Any:
            renewed.append(await store.heartbeat(claim, now=app.clock(), lease=app.settings.lease_timeout))
            return await act(*args, **kwargs)

        monkeypatch.setattr(store, acts, after_a_heartbeat)
        assert await outlive_lease(app) == 1
        report = await app.reap_once()
        monkeypatch.undo()

        assert renewed == [True]
        assert (report.redelivered, report.dead_lettered, report.reconciled, report.acked_stale) == (0, 0, 0, 0)
        assert app.get_task(task_id).state == TaskState.RUNNING
        assert await _pending(app) == 1  # still held: the worker runs on

        assert await outlive_lease(app) == 1  # now it is gone
        report = await app.reap_once()
        assert (report.redelivered, report.dead_lettered, report.reconciled) == (
            (1, 0, 0) if max_deliveries > 1 else (0, 1, 0)
        )
        info = app.get_task(task_id)
        assert (info.state, info.reclaims) == ((TaskState.PENDING, 1) if max_deliveries > 1 else (TaskState.DEAD, 0))
        assert await _pending(app) == 0


async def test_entry_read_but_never_claimed_is_redelivered(make_app: Callable[..., App]) -> None:
    """Even at max_deliveries=1: no code of the task ran, so the loss is not the task's, nor
    does it make the task a suspect."""
    async with _opened(make_app(max_deliveries=1)) as app:
        double = _register(app)
        task_id = _submit(app, double, 5)
        assert await app.dispatch_once() == 1
        await _read(app, "died-after-xreadgroup")  # no claim: the worker died right after reading
        assert app.get_task(task_id).state == TaskState.ENQUEUED

        assert await outlive_lease(app) == 1
        report = await app.reap_once()

        assert report.redelivered == 1
        info = app.get_task(task_id)
        assert info.state == TaskState.PENDING
        assert (info.delivery, info.reclaims) == (1, 0)
        assert info.attempts == ()  # nothing ever ran
        assert _outbox(app, task_id) == [(0, "SENT"), (1, "PENDING")]
        assert await _pending(app) == 0

        await _runs_to_success(app, task_id, 10, [(1, "succeeded")])
        assert await _pending(app) == 0


async def test_entry_whose_task_holds_a_live_lease_is_kept(make_app: Callable[..., App]) -> None:
    clock = FrozenClock()
    async with _opened(make_app(clock=clock)) as app:
        double = _register(app)
        task_id = _submit(app, double, 1)
        assert await app.dispatch_once() == 1
        [entry] = await _read(app, "busy-worker")
        assert await claim_entry(app, entry, "busy-worker") is not None

        # Redis says the entry is idle past the lease; the database (frozen clock) says the
        # worker's lease is live: the worker may simply be running a long task.
        assert await make_idle(app, _past_lease(app)) == 1
        report = await app.reap_once()

        assert report.kept == 1
        assert (report.redelivered, report.dead_lettered, report.acked_stale, report.reconciled) == (0, 0, 0, 0)
        info = app.get_task(task_id)
        assert info.state == TaskState.RUNNING
        assert (info.delivery, info.reclaims) == (0, 0)
        assert _history(app, task_id) == [(1, None)]
        assert _outbox(app, task_id) == [(0, "SENT")]
        assert await _pending(app) == 1  # still unacknowledged

        # The same entry is recovered once the lease does run out: it was the lease that kept it.
        assert await outlive_lease(app) == 1  # again: the reaper's XAUTOCLAIM reset the idle time
        report = await app.reap_once()
        assert report.redelivered == 1
        assert app.get_task(task_id).delivery == 1
        assert _history(app, task_id) == [(1, "lost")]
        assert await _pending(app) == 0


async def test_a_lost_attempt_does_not_use_up_max_attempts(app: App) -> None:
    """``App.task``: "max_attempts counts executions that raise". A worker that vanished did
    not raise, so after one lost attempt a task with max_attempts=2 still gets two raising runs."""
    ran: list[int] = []

    @app.task(name="reaper.flaky", queue=QUEUE, max_attempts=2)
    def flaky(ctx: TaskContext[Job], p: Job) -> int:
        ran.append(ctx.attempt)
        raise RuntimeError(f"boom {p.n}")

    task_id = _submit(app, flaky, 1)
    assert await app.dispatch_once() == 1
    [entry] = await _read(app, "vanished")
    assert await claim_entry(app, entry, "vanished") is not None
    assert await outlive_lease(app) == 1
    assert (await app.reap_once()).redelivered == 1

    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = app.get_task(task_id)
    assert info.state == TaskState.RETRYING, _history(app, task_id)  # 1 of 2 raising executions used

    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state == TaskState.FAILED
    assert _history(app, task_id) == [(1, "lost"), (2, "failed"), (3, "failed")]
    assert ran == [2, 3]


# -- poison and garbage ----------------------------------------------------------------------


async def test_task_past_max_deliveries_goes_dead_with_one_dlq_entry(make_app: Callable[..., App]) -> None:
    async with _opened(make_app(max_deliveries=1)) as app:
        double = _register(app)
        task_id = _submit(app, double, 3)
        client = _redis(app)

        # First lost delivery, while running beside others (it may be a bystander): redelivered.
        assert await app.dispatch_once() == 1
        [entry] = await _read(app, "oom-killed-1")
        assert await claim_entry(app, entry, "oom-killed-1") is not None
        assert await outlive_lease(app) == 1
        report = await app.reap_once()
        assert (report.redelivered, report.dead_lettered) == (1, 0)
        assert await client.xlen(_dlq(app)) == 0

        # Second lost delivery, now running alone (a suspect; the worker marks it solo): its own
        # loss, and it reaches max_deliveries: DEAD and dead-lettered.
        assert await app.dispatch_once() == 1
        [entry] = await _read(app, "oom-killed-2")
        assert parse_delivery(entry.fields).delivery == 1
        claim = await die_running_alone(app, entry, "oom-killed-2")
        assert claim.reclaims == 1  # a suspect: the worker runs it alone, and this one dies
        assert await outlive_lease(app) == 1
        report = await app.reap_once()
        assert (report.redelivered, report.dead_lettered) == (0, 1)

        info = app.get_task(task_id)
        assert info.state == TaskState.DEAD
        assert info.error_type == "DeadLettered"
        assert info.error_message is not None
        assert "max_deliveries" in info.error_message
        assert info.finished_at is not None
        assert _history(app, task_id) == [(1, "lost"), (2, "lost")]
        assert _outbox(app, task_id) == [(0, "SENT"), (1, "SENT")]  # no third delivery
        assert await _pending(app) == 0
        dlq = await _xrange(app, _dlq(app))
        assert len(dlq) == 1
        fields = dlq[0][1]
        assert (fields["t"], fields["g"], fields["d"], fields["n"]) == (task_id, "0", "1", TASK_NAME)
        assert fields["dt_entry"] == entry.entry_id
        assert "max_deliveries" in fields["dt_reason"]

        # Reaping again changes nothing.
        report = await app.reap_once()
        assert (report.redelivered, report.dead_lettered, report.reconciled) == (0, 0, 0)
        assert await client.xlen(_dlq(app)) == 1

        # A duplicate of the dead delivery turns up pending (e.g. republished after its dedup key
        # expired, read by a worker that died): it is acknowledged, and the DLQ still holds one entry.
        dup_id = await client.xadd(_stream(app), {"t": task_id, "g": "0", "d": "1", "n": TASK_NAME})
        [dup] = await _read(app, "oom-killed-3")
        assert dup.entry_id == dup_id
        assert await outlive_lease(app) == 1
        report = await app.reap_once()
        assert report.acked_stale == 1
        assert (report.redelivered, report.dead_lettered) == (0, 0)
        assert await client.xlen(_dlq(app)) == 1
        assert await _pending(app) == 0

        # Nothing will run it again.
        assert await app.dispatch_once() == 0
        assert app.get_task(task_id).state == TaskState.DEAD


async def test_malformed_entry_left_pending_is_dead_lettered_and_acked(app: App) -> None:
    double = _register(app)
    client = _redis(app)
    await app.runtime.transport().ensure_group(_stream(app))
    garbage_id = await client.xadd(_stream(app), {"hello": "world", "g": "not-a-number"})
    [garbage] = await _read(app, "crashed-on-garbage")
    assert garbage.entry_id == garbage_id

    task_id = _submit(app, double, 50)  # a healthy task queued behind it
    assert await app.dispatch_once() == 1

    assert await outlive_lease(app) == 1  # the garbage (the healthy entry was never read)
    report = await app.reap_once()

    assert report.dead_lettered == 1
    assert (report.redelivered, report.kept) == (0, 0)
    assert await _pending(app) == 0
    dlq = await _xrange(app, _dlq(app))
    assert len(dlq) == 1
    fields = dlq[0][1]
    assert fields["dt_entry"] == garbage_id
    assert fields["hello"] == "world"
    assert fields["dt_reason"]

    again = await app.reap_once()
    assert again.dead_lettered == 0
    assert await client.xlen(_dlq(app)) == 1

    # The healthy task is untouched by all this and runs normally.
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    info = app.get_task(task_id)
    assert info.state == TaskState.SUCCEEDED
    assert info.result == 100
    assert (info.delivery, info.reclaims) == (0, 0)
    assert await _pending(app) == 0


async def test_malformed_entries_read_by_a_worker_go_to_dlq_and_others_run(app: App) -> None:
    double = _register(app)
    client = _redis(app)
    first = _submit(app, double, 1)
    assert await app.dispatch_once() == 1
    bad_ids = [
        await client.xadd(_stream(app), {"junk": "1"}),
        await client.xadd(_stream(app), {"t": "x" * 40, "g": "0", "d": "0", "n": TASK_NAME}),
        await client.xadd(_stream(app), {"t": str(uuid.uuid4()), "g": "-1", "d": "0", "n": TASK_NAME}),
    ]
    second = _submit(app, double, 2)
    assert await app.dispatch_once() == 1

    assert await app.work(max_tasks=5, timeout=timedelta(seconds=10)) == 5

    assert app.get_task(first).result == 2
    assert app.get_task(second).result == 4
    assert app.get_task(first).state == app.get_task(second).state == TaskState.SUCCEEDED
    dlq = await _xrange(app, _dlq(app))
    assert sorted(f["dt_entry"] for _, f in dlq) == sorted(bad_ids)
    assert all(f["dt_reason"] for _, f in dlq)
    assert await _pending(app) == 0


async def test_entry_naming_a_missing_task_waits_for_visibility_timeout_then_dlq(
    make_app: Callable[..., App],
) -> None:
    clock = FrozenClock()
    async with _opened(make_app(clock=clock, visibility_timeout=timedelta(minutes=10))) as app:
        _register(app)
        client = _redis(app)
        await app.runtime.transport().ensure_group(_stream(app))
        ghost = str(uuid.uuid4())
        ghost_entry = await client.xadd(_stream(app), {"t": ghost, "g": "0", "d": "0", "n": TASK_NAME})
        await _read(app, "died-holding-ghost")

        # Idle past the lease, but the database may be restoring: kept until visibility_timeout.
        assert await make_idle(app, _past_lease(app)) == 1
        report = await app.reap_once()
        assert report.kept == 1
        assert report.dead_lettered == 0
        assert await _pending(app) == 1

        clock.advance(timedelta(minutes=11))
        assert await make_idle(app, _past_lease(app)) == 1
        report = await app.reap_once()
        assert report.dead_lettered == 1
        assert await _pending(app) == 0
        dlq = await _xrange(app, _dlq(app))
        assert [(f["t"], f["dt_entry"]) for _, f in dlq] == [(ghost, ghost_entry)]


# -- reconciler ------------------------------------------------------------------------------


async def test_reconciler_redispatches_when_redis_lost_the_stream(app: App) -> None:
    double = _register(app)
    task_id = _submit(app, double, 7)
    assert await app.dispatch_once() == 1
    await _read(app, "worker-on-lost-redis")  # the group exists and the entry was pending
    assert app.get_task(task_id).state == TaskState.ENQUEUED

    # Redis restarts without persistence: the namespace's stream, group and dedup keys are gone.
    client = _redis(app)
    lost = [k async for k in client.scan_iter(match=f"dt:{{{app.settings.namespace}:*")]
    assert _stream(app) in lost
    await client.delete(*lost)

    report = await app.reap_once()

    assert report.reconciled == 1
    assert report.redelivered == 0
    info = app.get_task(task_id)
    assert info.state == TaskState.PENDING
    assert (info.delivery, info.reclaims) == (1, 0)  # Redis's loss is not counted against the task
    assert _outbox(app, task_id) == [(0, "SENT"), (1, "PENDING")]

    await _runs_to_success(app, task_id, 14, [(1, "succeeded")])
    assert await _pending(app) == 0

    report = await app.reap_once()
    assert report.reconciled == 0


async def test_one_pass_reconciles_every_lost_entry_not_one_batch(make_app: Callable[..., App]) -> None:
    app = make_app(reaper_batch=5)  # 12 lost entries: three pages of the reconciler
    double = _register(app)
    with Session(app.engine) as s:
        ids = [h.id for h in double.submit_many(s, [(Job(n=n), None) for n in range(12)])]
        s.commit()
    assert await app.dispatch_once() == 12
    client = _redis(app)
    await client.delete(*[k async for k in client.scan_iter(match=f"dt:{{{app.settings.namespace}:*")])

    report = await app.reap_once()

    assert report.reconciled == 12
    assert {app.get_task(i).state for i in ids} == {TaskState.PENDING}


async def _sent_in_two_batches(app: App, clock: FrozenClock, first: int, then: int) -> tuple[list[str], list[str]]:
    """``first`` tasks dispatched, then a second later ``then`` more: the ids of each batch."""
    double = _register(app)
    batches: list[list[str]] = []
    for n in (first, then):
        with Session(app.engine) as s:
            batches.append([h.id for h in double.submit_many(s, [(Job(n=i), None) for i in range(n)])])
            s.commit()
        assert await app.dispatch_once() == n
        clock.advance(timedelta(seconds=1))
    clock.advance(app.settings.reconcile_grace)
    return batches[0], batches[1]


async def _lose_entries(app: App, task_ids: list[str]) -> None:
    """Redis loses the entries of these tasks (never read: no PEL names them)."""
    doomed = [entry_id for entry_id, f in await _xrange(app, _stream(app)) if f["t"] in task_ids]
    assert len(doomed) == len(task_ids)
    assert await _redis(app).xdel(_stream(app), *doomed) == len(doomed)


async def test_reconciler_reaches_lost_entries_behind_a_full_page_that_exists(make_app: Callable[..., App]) -> None:
    """A page of entries Redis still holds (a backlog nobody read yet) sits ahead of entries
    it lost: the walk goes on past it (it once stopped there, and never reached them)."""
    clock = FrozenClock()
    app = make_app(clock=clock, reaper_batch=5)
    ahead, behind = await _sent_in_two_batches(app, clock, 5, 3)
    await _lose_entries(app, behind)

    report = await app.reap_once()

    assert report.reconciled == 3
    assert {app.get_task(i).state for i in behind} == {TaskState.PENDING}
    assert {app.get_task(i).state for i in ahead} == {TaskState.ENQUEUED}
    assert (await app.reap_once()).reconciled == 0


async def test_the_reconcilers_walk_goes_on_in_the_next_pass_and_wraps(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads up to its page limit (one page here) and the next pass goes on from there;
    the short page at the end starts the walk over, where an entry lost since waits."""
    monkeypatch.setattr(reaper, "_MAX_PAGES", 1)
    clock = FrozenClock()
    app = make_app(clock=clock, reaper_batch=5)
    ahead, behind = await _sent_in_two_batches(app, clock, 5, 3)
    await _lose_entries(app, behind)

    assert (await app.reap_once()).reconciled == 0  # the page ahead: every entry exists
    assert (await app.reap_once()).reconciled == 3  # the next page, short: the end
    await _lose_entries(app, ahead[:1])
    assert (await app.reap_once()).reconciled == 1  # from the start again
    assert app.get_task(ahead[0]).state == TaskState.PENDING
    assert (await app.reap_once()).reconciled == 0  # past the page: nothing left (the end)
    await _lose_entries(app, ahead[1:2])
    assert (await app.reap_once()).reconciled == 1


async def test_a_reconciler_pass_walks_a_bounded_number_of_pages_where_nothing_was_lost(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog whose entries all exist costs a pass a few pages, not the whole walk: the
    lost entries behind it are reached in a later pass, from where this one stopped."""
    monkeypatch.setattr(reaper, "_RECONCILE_CLEAN_PAGES", 1)
    clock = FrozenClock()
    app = make_app(clock=clock, reaper_batch=5)
    _, behind = await _sent_in_two_batches(app, clock, 10, 3)  # two full pages ahead, then 3
    await _lose_entries(app, behind)

    assert (await app.reap_once()).reconciled == 0  # one clean page, then the pass ends
    assert (await app.reap_once()).reconciled == 0  # the second page ahead
    assert (await app.reap_once()).reconciled == 3  # the page behind it
    assert {app.get_task(i).state for i in behind} == {TaskState.PENDING}


async def test_the_reconcilers_walk_takes_tasks_claimed_before_their_mark_sent_first(
    make_app: Callable[..., App],
) -> None:
    """A task a worker claimed before its mark-SENT committed has no enqueued_at: the walk
    reads those first (pages of them, by id), then the others, and misses none."""
    clock = FrozenClock()
    app = make_app(clock=clock, reaper_batch=2)
    unstamped, stamped = await _sent_in_two_batches(app, clock, 3, 2)
    expired = clock() - timedelta(seconds=5)  # their workers died: the leases ran out
    with app.engine.begin() as conn:
        conn.execute(
            sa.update(tasks_table)
            .where(tasks_table.c.id.in_(unstamped))
            .values(state=TaskState.RUNNING, attempt=1, enqueued_at=None, lease_expires_at=expired)
        )
    await _lose_entries(app, unstamped + stamped)

    report = await app.reap_once()  # pages: 2 unstamped, 1 unstamped + 1 stamped, 1 stamped (short)

    assert report.reconciled == 5
    assert {app.get_task(i).state for i in unstamped + stamped} == {TaskState.PENDING}


async def test_pending_entry_deleted_from_stream_leaves_pel_and_task_is_reconciled(app: App) -> None:
    double = _register(app)
    task_id = _submit(app, double, 8)
    assert await app.dispatch_once() == 1
    [entry] = await _read(app, "reader")
    client = _redis(app)
    assert await client.xdel(_stream(app), entry.entry_id) == 1
    assert await _pending(app) == 1  # the PEL still names the deleted entry

    report = await app.reap_once()

    assert report.deleted_entries == [entry.entry_id]
    assert report.reconciled == 1
    assert await _pending(app) == 0
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).result == 16


# -- trimming --------------------------------------------------------------------------------


@asynccontextmanager
async def _dispatched_untouched(make_app: Callable[..., App], n: int) -> AsyncIterator[tuple[App, str]]:
    """An app whose ``n`` tasks are in the stream (and the stream's key), none to be reclaimed
    or reconciled: a long lease keeps pending entries out of reclaim, a long grace keeps the
    reconciler away from tasks whose entries a test acknowledges by hand without running them."""
    async with _opened(make_app(lease_timeout=timedelta(minutes=10), reconcile_grace=timedelta(hours=1))) as app:
        double = _register(app)
        for i in range(n):
            _submit(app, double, i)
        assert await app.dispatch_once() == n
        yield app, _stream(app)


async def test_trim_drops_acknowledged_entries_but_never_a_pending_or_undelivered_one(
    make_app: Callable[..., App],
) -> None:
    async with _dispatched_untouched(make_app, 4) as (app, stream):
        client = _redis(app)
        e1, e2, e3 = (e.entry_id for e in await _read(app, "c1", count=3))
        [(e4, _)] = await _xrange(app, stream, start=f"({e3}")  # never delivered
        assert await app.runtime.transport().ack(stream, [e1, e3]) == 2

        report = await app.reap_once()

        assert report.trimmed == 1
        assert await client.xlen(stream) == 3
        assert [i for i, _ in await _xrange(app, stream)] == [e2, e3, e4]
        pending = await client.xpending_range(stream, CONSUMER_GROUP, min="-", max="+", count=10)
        assert [p["message_id"] for p in pending] == [e2]

        # Nothing below the pending entry is left, so a second pass trims nothing.
        assert (await app.reap_once()).trimmed == 0
        assert [i for i, _ in await _xrange(app, stream)] == [e2, e3, e4]

        # Once e2 is acknowledged the floor moves to the last delivered entry; e4 stays.
        assert await app.runtime.transport().ack(stream, [e2]) == 1
        assert (await app.reap_once()).trimmed == 1
        assert [i for i, _ in await _xrange(app, stream)] == [e3, e4]


async def test_trim_never_drops_an_entry_a_worker_reads_while_it_looks(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trim's floor comes from two reads, the group's last delivered id and its PEL; a
    worker that reads an entry between them makes it both delivered and pending. Read in the
    other order, the floor passes it: the pending entry is trimmed, its worker's death goes
    unseen by the PEL scan (XAUTOCLAIM drops deleted entries) and is reconciled as an entry
    Redis lost, not counted against max_deliveries."""
    async with _dispatched_untouched(make_app, 3) as (app, stream):
        [first] = await _read(app, "c1")
        assert await app.runtime.transport().ack(stream, [first.entry_id]) == 1
        client = _redis(app)
        looked: list[str] = []
        read: list[StreamEntry] = []

        def between(name: str) -> Callable[..., Any]:
            real = getattr(client, name)

            async def look(*args: Any, **kwargs: Any) -> Any:
                looked.append(name)
                if len(looked) == 2:  # the second of the floor's two reads: a worker reads first
                    read.extend(await _read(app, "c2", count=2))
                return await real(*args, **kwargs)

            return look

        for name in ("xpending", "xinfo_groups"):
            monkeypatch.setattr(client, name, between(name))

        report = await app.reap_once()

        assert sorted(looked[:2]) == ["xinfo_groups", "xpending"]
        assert len(read) == 2
        held = [e.entry_id for e in read]
        assert [i for i, _ in await _xrange(app, stream)][-2:] == held  # both entries c2 holds
        # The next pass, with nothing read in between, trims the acknowledged entry only.
        assert report.trimmed + (await app.reap_once()).trimmed == 1
        assert [i for i, _ in await _xrange(app, stream)] == held


async def test_a_dead_lettered_task_runs_its_failure_hooks(make_app: Callable[..., App]) -> None:
    """The hooks get the task's payload, a large one too (kept in dt_payloads on SQLite and MySQL)."""
    app = make_app(max_deliveries=1)
    marks: list[tuple[str, str, str | None]] = []
    large = "x" * (ASIDE_PAYLOAD_BYTES + 100)

    @app.task(name="doomed-by-reaper", queue=QUEUE)
    def doomed(ctx: TaskContext[str], text: str) -> int:
        return len(text)

    @doomed.on_failure
    def mark(session: Session, ctx: TaskContext[str], error: BaseException) -> None:
        marks.append((ctx.task_id, type(error).__name__, ctx.payload))

    with Session(app.engine) as s:
        task_id = app.submit(s, "doomed-by-reaper", large).id
        s.commit()
    await app.dispatch_once()
    [entry] = await _read(app, "dies")
    await die_running_alone(app, entry, "dies")  # it died running alone: its own loss
    assert await outlive_lease(app) == 1
    assert (await app.reap_once()).dead_lettered == 1
    assert app.get_task(task_id).state == TaskState.DEAD
    assert marks == [(task_id, "TaskDeadLetteredError", large)]


async def test_concurrent_reapers_redeliver_each_lost_delivery_once(make_app: Callable[..., App]) -> None:
    async with _opened(make_app()) as app:
        double = _register(app)
        ids = [_submit(app, double, i) for i in range(20)]
        while await app.dispatch_once():
            pass
        await _read(app, "died-with-all-of-them", count=20)
        assert await outlive_lease(app) == 20
        reports = []

        async def reap() -> None:
            reports.append(await app.reap_once())

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(reap)
        assert sum(r.redelivered for r in reports) == 20  # three reapers, each delivery once
        assert all(_outbox(app, task_id) == [(0, "SENT"), (1, "PENDING")] for task_id in ids)
