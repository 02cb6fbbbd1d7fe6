"""Dispatcher: claim with a lease, publish through the Lua dedup script, mark SENT."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks import dispatcher as dispatcher_module
from durable_tasks.records import OutboxState, outbox_table
from durable_tasks.store import sql
from durable_tasks.store.engine import read_only
from durable_tasks.store.pooler import notify_reaches
from durable_tasks.store.postgres import notify as pg_notify
from durable_tasks.store.postgres import statements as pg_statements
from durable_tasks.transport.keys import QueueKeys
from durable_tasks.transport.messages import OutgoingMessage
from tests.helpers import entries as stream_entries
from tests.helpers import submit_all, wait_until

pytestmark = pytest.mark.anyio


class Job(BaseModel):
    n: int


def register(app: App) -> None:
    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[Job], p: Job) -> int:
        return p.n


def submit_many(app: App, n: int, start: int = 0) -> list[str]:
    """``n`` jobs numbered from ``start``, job i with the idempotency key ``k<i>``."""
    numbers = range(start, start + n)
    return [h.id for h in submit_all(app, "job", ({"n": i} for i in numbers), keys=(f"k{i}" for i in numbers))]


def outbox_states(app: App) -> list[str]:
    with read_only(app.engine).connect() as conn:
        return list(
            conn.execute(
                sa.select(outbox_table.c.state)
                .where(outbox_table.c.namespace == app.settings.namespace)
                .order_by(outbox_table.c.id)
            ).scalars()
        )


async def stream_len(app: App, queue: str = "jobs") -> int:
    return int(await app.runtime.transport().client.xlen(QueueKeys(app.settings.namespace, queue).stream))


async def test_a_pass_claims_at_most_batch_size_rows(make_app: Callable[..., App]) -> None:
    app = make_app(batch_size=7)
    register(app)
    submit_many(app, 10)
    assert await app.dispatch_once() == 7
    assert outbox_states(app).count(OutboxState.SENT) == 7
    assert await app.dispatch_once() == 3
    assert await app.dispatch_once() == 0
    assert await stream_len(app) == 10
    await app.aclose()


async def test_sent_row_keeps_the_entry_id_and_task_becomes_enqueued(app: App) -> None:
    register(app)
    [task_id] = submit_many(app, 1)
    await app.dispatch_once()
    with read_only(app.engine).connect() as conn:
        stream_id = conn.execute(
            sa.select(outbox_table.c.stream_id).where(outbox_table.c.task_id == task_id)
        ).scalar_one()
    entries = await stream_entries(app, QueueKeys(app.settings.namespace, "jobs").stream)
    assert [e[0] for e in entries] == [stream_id]
    assert entries[0][1]["t"] == task_id
    assert app.get_task(task_id).state == TaskState.ENQUEUED


async def test_a_claim_tells_when_the_next_row_not_due_yet_will_be(app: App) -> None:
    """lease_outbox_and_next_due: the due rows, leased, and the earliest due time of the rows
    not due yet, which it leaves alone; with nothing due, no rows and still that time."""
    register(app)
    [due_now] = submit_many(app, 1)
    submit_all(app, "job", [{"n": 1}], delay=timedelta(minutes=5))
    submit_all(app, "job", [{"n": 2}], delay=timedelta(minutes=9))
    ns, now = app.settings.namespace, app.clock()
    store = app.runtime.store
    rows, due = await store.lease_outbox_and_next_due(
        ns, now=now, lease=timedelta(seconds=30), limit=10, watermark=None
    )
    assert [r.task_id for r in rows] == [due_now]
    assert due is not None
    assert timedelta(minutes=4) < due - now <= timedelta(minutes=6)
    again, due_again = await store.lease_outbox_and_next_due(
        ns, now=now, lease=timedelta(seconds=30), limit=10, watermark=None
    )
    assert again == []
    assert due_again == due
    later = now + timedelta(minutes=10)  # both delayed rows are due (and the first's lease is
    rows, due = await store.lease_outbox_and_next_due(  # over): none waits after them
        ns, now=later, lease=timedelta(seconds=30), limit=10, watermark=None
    )
    assert len(rows) == 3
    assert due is None


async def test_dispatcher_dying_between_xadd_and_mark_sent_republishes_nothing(app: App) -> None:
    register(app)
    [task_id] = submit_many(app, 1)
    # The dying dispatcher: it claimed the row and ran the script, then crashed before mark-SENT.
    [row] = await app.runtime.store.lease_outbox(
        app.settings.namespace, now=app.clock(), lease=timedelta(0), limit=10, watermark=None
    )
    [first_id] = await app.runtime.transport().publish(
        [OutgoingMessage(row.queue, row.task_id, row.generation, row.delivery, row.name)]
    )
    assert isinstance(first_id, str)
    # Its lease (zero here) has run out: the next dispatcher publishes the same delivery again.
    assert await app.dispatch_once() == 1
    assert await stream_len(app) == 1
    with read_only(app.engine).connect() as conn:
        stream_id = conn.execute(
            sa.select(outbox_table.c.stream_id).where(outbox_table.c.task_id == task_id)
        ).scalar_one()
    assert stream_id == first_id


async def test_a_new_delivery_of_the_same_generation_does_go_out(app: App) -> None:
    register(app)
    [task_id] = submit_many(app, 1)
    await app.dispatch_once()
    msg = OutgoingMessage("jobs", task_id, 0, 1, "job")
    [second] = await app.runtime.transport().publish([msg])
    [again] = await app.runtime.transport().publish([msg])
    assert second == again
    assert await stream_len(app) == 2


async def test_two_dispatchers_never_publish_a_row_twice(make_app: Callable[..., App]) -> None:
    apps = [make_app(batch_size=25) for _ in range(2)]
    for a in apps:
        register(a)
    submit_many(apps[0], 400)
    handled = [0, 0]

    async def drain(i: int) -> None:
        while True:
            n = await apps[i].dispatch_once()
            if n == 0:
                return
            handled[i] += n

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain, 0)
        tg.start_soon(drain, 1)
    assert sum(handled) == 400
    assert outbox_states(apps[0]) == [OutboxState.SENT] * 400
    # Each delivery went out once: one entry per task in the stream.
    entries = await stream_entries(apps[0], QueueKeys(apps[0].settings.namespace, "jobs").stream)
    assert len(entries) == 400
    assert len({e[1]["t"] for e in entries}) == 400
    for a in apps:
        await a.aclose()


async def test_rows_below_the_cutover_watermark_are_not_dispatched(make_app: Callable[..., App]) -> None:
    legacy = make_app(publish_on_commit=False)  # rows of the legacy path: only a dispatcher could send them
    register(legacy)
    submit_many(legacy, 3)
    with read_only(legacy.engine).connect() as conn:
        top = conn.execute(
            sa.select(sa.func.max(outbox_table.c.id)).where(outbox_table.c.namespace == legacy.settings.namespace)
        ).scalar_one()
    app = make_app(cutover_watermark=top + 1)
    register(app)
    submit_many(app, 2, start=10)
    assert await app.dispatch_once() == 2
    assert outbox_states(app) == [OutboxState.PENDING] * 3 + [OutboxState.SENT] * 2
    assert await stream_len(app) == 2
    await app.aclose()
    await legacy.aclose()


async def test_shadow_tasks_travel_on_the_shadow_stream_and_never_run_hooks(app: App) -> None:
    hooked: list[str] = []

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[Job], p: Job) -> int:
        return p.n * 2

    @job.on_commit
    def hook(session: Session, ctx: TaskContext[Job], result: int) -> None:
        hooked.append(ctx.task_id)

    with Session(app.engine) as s:
        shadow = job.submit(s, {"n": 4}, shadow=True)
        real = job.submit(s, {"n": 5})
        s.commit()
    await app.dispatch_once()
    keys = QueueKeys(app.settings.namespace, "jobs")
    assert [e[1]["t"] for e in await stream_entries(app, keys.shadow)] == [shadow.id]
    assert [e[1]["t"] for e in await stream_entries(app, keys.stream)] == [real.id]
    assert await app.work(max_tasks=2, timeout=timedelta(seconds=10)) == 2
    assert hooked == [real.id]
    info = app.get_task(shadow.id)
    assert (info.state, info.result, info.shadow) == (TaskState.SUCCEEDED, 8, True)


@pytest.mark.postgres_only
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_notify_wakes_the_dispatcher_before_the_poll_interval(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(poll_interval=timedelta(seconds=60))
    register(app)
    listening = anyio.Event()

    async def check_then_tell(*args: Any, **kwargs: Any) -> tuple[bool, list[str]]:
        reached = await notify_reaches(*args, **kwargs)
        listening.set()  # the waiter's LISTEN is proven: a NOTIFY from now on reaches it
        return reached

    monkeypatch.setattr(pg_notify, "notify_reaches", check_then_tell)  # the waiter's own check
    async with anyio.create_task_group() as tg:
        from durable_tasks.dispatcher import Dispatcher

        tg.start_soon(Dispatcher(app.runtime).run)
        with anyio.fail_after(20):
            await listening.wait()  # the first pass found nothing; the dispatcher waits (60 s poll)
        [task_id] = submit_many(app, 1)
        # Far below the 60 s poll: only NOTIFY can explain it.
        await wait_until(
            lambda: app.get_task(task_id).state == TaskState.ENQUEUED, timeout=20, what="NOTIFY to wake the dispatcher"
        )
        tg.cancel_scope.cancel()
    await app.aclose()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # a PostgreSQL setting
async def test_the_dispatchers_statements_do_not_wait_for_the_wal_flush(make_app: Callable[..., App]) -> None:
    """The lease and the mark-SENT each run as one statement, their own transaction, and turn
    off the wait for the WAL flush themselves (a lost lease or mark is a deduplicated
    republish). Run inside a transaction here, so that the setting can be read after them."""
    app = make_app()
    register(app)
    submit_many(app, 3)
    now = app.clock()
    with app.engine.begin() as conn:
        params = {"namespaces": [app.settings.namespace], "now": now, "lease_until": now + timedelta(seconds=30),
                  "token": "t", "limit": 10, "watermark": 0, "inline_payload": 65536}  # fmt: skip
        assert len(conn.exec_driver_sql(sql.postgres()["claim_outbox"], params).all()) == 3
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
        conn.rollback()
    rows = await app.runtime.store.lease_outbox(
        app.settings.namespace, now=now, lease=timedelta(seconds=30), limit=10, watermark=None
    )
    with app.engine.begin() as conn:
        assert pg_statements.mark_sent([(row, "1-0", None) for row in rows], now).run_on(conn) == 3
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
        conn.rollback()
    sent = await app.runtime.store.settle_outbox(
        sent=[(row, "1-0", None) for row in rows], dead=[], retry=[], held=[], now=now, release_at=now
    )
    assert sent == 3
    assert outbox_states(app) == [OutboxState.SENT] * 3
    with app.engine.connect() as conn:  # the setting never outlives its transaction
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "on"


async def test_a_pass_that_was_not_full_lets_the_worker_claim_before_it_marks(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a low rate (a pass that found fewer rows than batch_size) the mark-SENT waits a head
    start, so the worker the entry woke takes the task row before the mark locks it; a full
    pass (a backlog) marks at once."""
    waits: list[float] = []
    real_sleep = anyio.sleep

    async def recorded_sleep(delay: float) -> None:
        waits.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(anyio, "sleep", recorded_sleep)  # the module the dispatcher calls it through
    small = make_app(batch_size=10)
    register(small)
    submit_many(small, 2)
    assert await small.dispatch_once() == 2
    assert waits == [dispatcher_module._CLAIM_HEAD_START_S]
    assert outbox_states(small) == [OutboxState.SENT] * 2

    full = make_app(batch_size=2)
    register(full)
    submit_many(full, 2, start=2)  # the same namespace: new idempotency keys
    assert await full.dispatch_once() == 2
    assert waits == [dispatcher_module._CLAIM_HEAD_START_S]  # no second wait
    assert outbox_states(full) == [OutboxState.SENT] * 4
