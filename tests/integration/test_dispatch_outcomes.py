"""What one dispatcher pass does with a due outbox row: send it, hold it, or back off, on real
PostgreSQL / SQLite and Redis. Time moves only through a FrozenClock: nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks.records import OutboxState
from tests.helpers import outbox_row, task_row

pytestmark = pytest.mark.anyio

QUEUE = "mail"
MS = timedelta(milliseconds=1)


class Email(BaseModel):
    to: str


def register(app: App) -> None:
    @app.task(name="send_email", queue=QUEUE)
    def send_email(ctx: TaskContext[Email], p: Email) -> str:
        return p.to


@pytest.fixture
async def build(make_app: Callable[..., App], clock: FrozenClock) -> AsyncIterator[Callable[..., App]]:
    """``make_app`` on the frozen clock with the mail task registered; Apps closed at teardown."""
    made: list[App] = []

    def build_app(**overrides: Any) -> App:
        app = make_app(clock=clock, **overrides)
        made.append(app)
        register(app)
        return app

    yield build_app
    for app in made:
        await app.aclose()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


def stream_key(namespace: str) -> str:
    return f"dt:{{{namespace}:{QUEUE}}}:stream"


def submit(app: App, to: str = "ada@example.com") -> str:
    with Session(app.engine) as session:
        handle = app.submit(session, "send_email", Email(to=to))
        session.commit()
    return handle.id


async def stream_entries(client: aioredis.Redis, key: str) -> list[tuple[str, dict[str, str]]]:
    reply = await client.xrange(key) or []
    return [(str(entry_id), {str(k): str(v) for k, v in (fields or {}).items()}) for entry_id, fields in reply]


def advance_past(clock: FrozenClock, row: sa.Row[Any]) -> None:
    clock.advance(row.next_attempt_at - clock() + MS)


# -- success ---------------------------------------------------------------------------


async def test_sent_row_records_the_stream_entry_id_and_enqueues_the_task(
    build: Callable[..., App], clock: FrozenClock, redis_client: aioredis.Redis, namespace: str
) -> None:
    app = build()
    task_id = submit(app)

    assert await app.dispatch_once() == 1

    outbox = outbox_row(app, task_id)
    entries = await stream_entries(redis_client, stream_key(namespace))
    assert len(entries) == 1
    entry_id, fields = entries[0]
    assert outbox.state == OutboxState.SENT
    assert outbox.stream_id == entry_id
    assert outbox.sent_at == clock()
    assert (outbox.attempts, outbox.last_error, outbox.lease_expires_at) == (0, None, None)
    task = task_row(app, task_id)
    # The trace context rides along exactly when the submit recorded one: that depends on whether
    # some earlier test in this process installed a global TracerProvider (it stays for good).
    assert fields.pop("tp", None) == task.traceparent
    assert fields == {"t": task_id, "g": "0", "d": "0", "n": "send_email"}
    assert task.state == TaskState.ENQUEUED
    assert task.enqueued_at == clock()
    assert await app.dispatch_once() == 0


# -- enqueue raised ----------------------------------------------------------------------


async def test_enqueue_error_counts_an_attempt_backs_off_and_keeps_the_error(
    build: Callable[..., App], clock: FrozenClock, redis_client: aioredis.Redis, namespace: str
) -> None:
    app = build()
    await redis_client.set(stream_key(namespace), "x")  # XADD on a string: WRONGTYPE
    task_id = submit(app)
    before = clock()

    assert await app.dispatch_once() == 1

    outbox = outbox_row(app, task_id)
    assert outbox.state == OutboxState.PENDING
    assert outbox.attempts == 1
    assert outbox.next_attempt_at > before
    assert outbox.next_attempt_at - before <= app.settings.backoff_max + app.settings.backoff_jitter
    assert "WRONGTYPE" in outbox.last_error
    assert outbox.stream_id is None
    assert outbox.lease_expires_at is None  # given back, not left claimed
    assert task_row(app, task_id).state == TaskState.PENDING
    # The script failed at XADD, before SET: no dedup key may block the real publish later.
    assert await redis_client.keys(f"dt:{{{namespace}:{QUEUE}}}:dedup:*") == []
    # Not due again until the backoff has passed.
    assert await app.dispatch_once() == 0
    assert outbox_row(app, task_id).attempts == 1


async def test_repeated_enqueue_errors_back_off_exponentially_up_to_the_cap(
    build: Callable[..., App], clock: FrozenClock, redis_client: aioredis.Redis, namespace: str
) -> None:
    app = build(
        backoff_initial=timedelta(seconds=1),
        backoff_max=timedelta(seconds=60),
        backoff_jitter=timedelta(seconds=1),
    )
    cap, jitter = app.settings.backoff_max, app.settings.backoff_jitter
    await redis_client.set(stream_key(namespace), "x")
    task_id = submit(app)

    delays: list[timedelta] = []
    for failures in range(1, 11):
        assert await app.dispatch_once() == 1
        row = outbox_row(app, task_id)
        delay = row.next_attempt_at - clock()
        assert row.attempts == failures
        assert "WRONGTYPE" in row.last_error
        assert delay <= cap + jitter, f"failure {failures}: backoff {delay} is above the cap"
        assert delay >= min(timedelta(seconds=2 ** (failures - 1)), cap), f"failure {failures}: {delay} too short"
        delays.append(delay)
        assert task_row(app, task_id).state == TaskState.PENDING
        advance_past(clock, row)
    assert delays[-1] >= cap  # reached the cap and stayed there
    assert await redis_client.type(stream_key(namespace)) == "string"


async def test_row_is_sent_on_a_later_pass_once_redis_accepts_it(
    build: Callable[..., App], clock: FrozenClock, redis_client: aioredis.Redis, namespace: str
) -> None:
    app = build()
    await redis_client.set(stream_key(namespace), "x")
    task_id = submit(app)
    assert await app.dispatch_once() == 1
    assert outbox_row(app, task_id).attempts == 1

    await redis_client.delete(stream_key(namespace))
    assert await app.dispatch_once() == 0  # still backing off: not due yet
    advance_past(clock, outbox_row(app, task_id))
    assert await app.dispatch_once() == 1

    outbox = outbox_row(app, task_id)
    entries = await stream_entries(redis_client, stream_key(namespace))
    assert [entry_id for entry_id, _ in entries] == [outbox.stream_id]
    assert outbox.state == OutboxState.SENT
    assert outbox.attempts == 1
    assert task_row(app, task_id).state == TaskState.ENQUEUED
    assert await app.dispatch_once() == 0


async def test_unreachable_redis_at_dispatch_backs_off_every_row(
    build: Callable[..., App], clock: FrozenClock, database_url: str, namespace: str, tmp_path: Path
) -> None:
    app = build()
    first, second = submit(app, "a@example.com"), submit(app, "b@example.com")
    down = App(database_url, "redis://127.0.0.1:1", namespace, data_dir=tmp_path / "down", clock=clock)
    register(down)
    try:
        assert await down.dispatch_once() == 2
    finally:
        await down.aclose()

    for task_id in (first, second):
        outbox = outbox_row(app, task_id)
        assert (outbox.state, outbox.attempts) == (OutboxState.PENDING, 1)
        assert "ConnectionError" in outbox.last_error
        assert outbox.next_attempt_at > clock()
        assert task_row(app, task_id).state == TaskState.PENDING
    # The healthy app sends them once their backoff (with the default jitter) has passed.
    advance_past(clock, max((outbox_row(app, t) for t in (first, second)), key=lambda r: r.next_attempt_at))
    assert await app.dispatch_once() == 2
    assert {outbox_row(app, t).state for t in (first, second)} == {OutboxState.SENT}


# -- no transport for the queue --------------------------------------------------------


async def test_paused_queue_keeps_the_row_pending_without_counting_a_failure(
    build: Callable[..., App], clock: FrozenClock, redis_client: aioredis.Redis, namespace: str
) -> None:
    app = build()
    app.runtime.paused_queues.add(QUEUE)  # before the submit: its commit publishes nothing either
    task_id = submit(app)

    await app.dispatch_once()

    outbox = outbox_row(app, task_id)
    assert outbox.state == OutboxState.PENDING
    assert outbox.attempts == 0
    assert outbox.last_error is None
    assert outbox.lease_expires_at is None
    assert outbox.stream_id is None
    assert task_row(app, task_id).state == TaskState.PENDING
    assert await redis_client.exists(stream_key(namespace)) == 0

    # Still paused on a later pass: still held, still not a failure.
    advance_past(clock, outbox)
    await app.dispatch_once()
    outbox = outbox_row(app, task_id)
    assert (outbox.state, outbox.attempts, outbox.last_error) == (OutboxState.PENDING, 0, None)

    app.runtime.paused_queues.discard(QUEUE)
    advance_past(clock, outbox)
    assert await app.dispatch_once() == 1

    outbox = outbox_row(app, task_id)
    entries = await stream_entries(redis_client, stream_key(namespace))
    assert [entry_id for entry_id, _ in entries] == [outbox.stream_id]
    assert (outbox.state, outbox.attempts, outbox.last_error) == (OutboxState.SENT, 0, None)
    assert task_row(app, task_id).state == TaskState.ENQUEUED


async def test_pausing_one_queue_does_not_hold_back_another(
    build: Callable[..., App], redis_client: aioredis.Redis, namespace: str
) -> None:
    app = build()

    @app.task(name="other", queue="other")
    def other(ctx: TaskContext[Email], p: Email) -> None:
        return None

    app.runtime.paused_queues.add(QUEUE)  # before the submits: their commits publish nothing either
    held = submit(app)
    with Session(app.engine) as session:
        moving = other.submit(session, Email(to="b@example.com")).id
        session.commit()
    assert app.runtime.wakeups.flush()  # the other queue's entry is out: the dispatch adds none

    await app.dispatch_once()

    assert outbox_row(app, held).state == OutboxState.PENDING
    assert outbox_row(app, moving).state == OutboxState.SENT
    assert await redis_client.xlen(f"dt:{{{namespace}:other}}:stream") == 1
    assert await redis_client.exists(stream_key(namespace)) == 0
