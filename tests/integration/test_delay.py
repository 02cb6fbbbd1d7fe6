"""Delayed tasks: a row not due yet is not published; the dispatcher wakes for the earliest
due row rather than at its next poll; bad delays are typed errors that write nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from functools import partial

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, TaskContext
from durable_tasks.errors import InvalidDelayError
from durable_tasks.records import outbox_table, tasks_table

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 2, 8, 0, 0, tzinfo=UTC)


def stamping_app(make_app: Callable[..., App], **overrides: object) -> App:
    app = make_app(**overrides)

    @app.task(name="stamp", queue="jobs")
    def stamp(ctx: TaskContext[int], n: int) -> float:
        return time.time()  # when the handler started

    return app


def count(app: App, table: sa.Table) -> int:
    with app.engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(table).where(table.c.namespace == app.settings.namespace)
        return int(conn.execute(query).scalar_one())


async def test_a_delayed_task_is_not_published_before_it_is_due(make_app: Callable[..., App]) -> None:
    clock = FrozenClock(T0)
    app = stamping_app(make_app, clock=clock)
    with Session(app.engine) as session:
        app.registry["stamp"].submit(session, 1, delay=timedelta(seconds=10))
        app.registry["stamp"].submit(session, 2, not_before=T0 + timedelta(seconds=20))
        app.registry["stamp"].submit(session, 3, not_before=T0 - timedelta(days=1))  # in the past: now
        session.commit()
    assert await app.dispatch_once() == 1
    clock.advance(timedelta(seconds=9, microseconds=999_999))
    assert await app.dispatch_once() == 0
    clock.advance(timedelta(microseconds=1))
    assert await app.dispatch_once() == 1
    clock.advance(timedelta(seconds=10))
    assert await app.dispatch_once() == 1
    await app.aclose()


async def test_a_rerun_can_be_delayed(make_app: Callable[..., App]) -> None:
    clock = FrozenClock(T0)
    app = stamping_app(make_app, clock=clock)
    with Session(app.engine) as session:
        handle = app.submit(session, "stamp", 1)
        session.commit()
    assert await app.dispatch_once() == 1
    with Session(app.engine) as session:
        assert app.rerun(session, handle.id, delay=timedelta(minutes=10)) == 1
        session.commit()
    assert await app.dispatch_once() == 0
    clock.advance(timedelta(minutes=10))
    assert await app.dispatch_once() == 1
    await app.aclose()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"not_before": datetime(2030, 1, 1, 9)}, "naive"),
        ({"delay": timedelta(seconds=-1)}, "zero or more"),
        ({"delay": timedelta(seconds=1), "not_before": T0}, "not both"),
        ({"delay": timedelta.max}, "ends past the year 9999"),  # not datetime's OverflowError
        # 9999-12-31 23:00 at UTC-5 is in the year 10000 in UTC: not datetime's OverflowError either
        ({"not_before": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))}, "past the year 9999"),
    ],
)
async def test_a_bad_delay_is_a_typed_error_and_writes_nothing(
    make_app: Callable[..., App], kwargs: dict[str, object], says: str
) -> None:
    app = stamping_app(make_app)
    with Session(app.engine) as session:
        with pytest.raises(InvalidDelayError, match=says):
            app.submit(session, "stamp", 1, **kwargs)  # type: ignore[arg-type]
        session.commit()
    assert (count(app, tasks_table), count(app, outbox_table)) == (0, 0)
    await app.aclose()


async def test_the_dispatcher_wakes_for_the_earliest_due_row_not_at_its_next_poll(
    make_app: Callable[..., App],
) -> None:
    # A poll interval far longer than the test may run: only the wake-up for the due row
    # can start the task in time.
    app = stamping_app(make_app, poll_interval=timedelta(minutes=5))
    delay = timedelta(milliseconds=700)
    with Session(app.engine) as session:
        handle = app.submit(session, "stamp", 1, delay=delay)
        session.commit()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, reaper=False, stop=stop))
        started = await handle.wait(timeout=60)
        stop.set()
    info = app.get_task(handle.id)
    created = info.created_at if info.created_at.tzinfo else info.created_at.replace(tzinfo=UTC)
    assert started >= (created + delay).timestamp(), "started before it was due"
    await app.aclose()
