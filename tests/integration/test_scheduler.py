"""Periodic schedules against the real database: one submit per tick however many schedulers
run, catch-up after downtime, pausing without a deploy."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from durable_tasks import App, FrozenClock, TaskContext
from durable_tasks.errors import UnknownScheduleError
from durable_tasks.periodic import CatchUp, Schedule
from durable_tasks.records import tasks_table
from durable_tasks.scheduler import Scheduler, list_schedules, pause_schedule
from tests.helpers import wait_until

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 2, 8, 0, 0, tzinfo=UTC)


def ticking_app(make_app: Callable[..., App], **overrides: Any) -> App:
    app = make_app(**overrides)

    @app.task(name="tick")
    def tick(ctx: TaskContext[datetime], at: datetime) -> None:
        return None

    return app


def submitted_ticks(app: App) -> list[datetime]:
    t = tasks_table.c
    with app.engine.connect() as conn:
        keys = conn.execute(
            sa.select(t.idempotency_key).where(t.namespace == app.settings.namespace, t.name == "tick")
        ).scalars()
        return sorted(datetime.strptime(k.split("@")[1], "%Y-%m-%dT%H:%M:%S%z") for k in keys)


async def test_three_schedulers_submit_every_tick_exactly_once(make_app: Callable[..., App]) -> None:
    schedule = Schedule.interval("every-second", "tick", timedelta(seconds=1))
    apps = [ticking_app(make_app) for _ in range(3)]
    schedulers = [Scheduler(a, {schedule.name: schedule}) for a in apps]
    wanted = 6
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for scheduler in schedulers:
                tg.start_soon(scheduler.run)
            # Ticks come a second apart on the wall clock: this test is about elapsed time.
            await wait_until(lambda: len(submitted_ticks(apps[0])) >= wanted, timeout=60, what=f"{wanted} ticks")
            tg.cancel_scope.cancel()
    ticks = submitted_ticks(apps[0])
    assert len(ticks) >= wanted
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))], "a tick was missed"
    # Each tick was submitted by exactly one scheduler: the losers of a tick's compare-and-set
    # never called submit (had one, its submit would have found the task: created=False).
    assert sum(s.submitted for s in schedulers) == len(ticks)
    assert sum(s.created for s in schedulers) == len(ticks)
    assert sum(1 for s in schedulers if s.submitted) >= 1
    for a in apps:
        await a.aclose()


@pytest.mark.parametrize(("catch_up", "expected"), [("latest", 1), ("all", 60), ("none", 0)])
async def test_after_an_hour_of_downtime_the_catch_up_policy_decides(
    make_app: Callable[..., App], catch_up: CatchUp, expected: int
) -> None:
    clock = FrozenClock(T0)
    app = ticking_app(make_app, clock=clock)
    schedule = Schedule.cron_schedule("minutely", "tick", "* * * * *", catch_up=catch_up)
    scheduler = Scheduler(app, {schedule.name: schedule})
    assert await scheduler.tick_once() == 0  # declared: its first tick is the one after now
    clock.advance(timedelta(hours=1, seconds=40))  # every scheduler was down meanwhile
    assert await scheduler.tick_once() == expected
    ticks = submitted_ticks(app)
    assert len(ticks) == expected
    if catch_up == "latest":
        assert ticks == [T0 + timedelta(hours=1)]
    assert await scheduler.tick_once() == 0  # nothing is due twice
    await app.aclose()


async def test_a_paused_schedule_submits_nothing_and_resuming_skips_the_paused_ticks(
    make_app: Callable[..., App],
) -> None:
    clock = FrozenClock(T0)
    app = ticking_app(make_app, clock=clock)
    schedule = Schedule.interval("every-minute", "tick", timedelta(minutes=1), catch_up="all")
    schedules = {schedule.name: schedule}
    scheduler = Scheduler(app, schedules)
    await scheduler.tick_once()
    pause_schedule(app, schedules, "every-minute", paused=True)  # as the CLI does: no deploy
    assert [i.paused for i in list_schedules(app, schedules)] == [True]
    clock.advance(timedelta(minutes=10))
    assert await scheduler.tick_once() == 0
    pause_schedule(app, schedules, "every-minute", paused=False)
    assert await scheduler.tick_once() == 0  # the ten paused ticks are not caught up
    clock.advance(timedelta(minutes=1))
    assert await scheduler.tick_once() == 1
    assert submitted_ticks(app) == [T0 + timedelta(minutes=11)]
    await app.aclose()


async def test_listing_shows_each_schedule_with_its_next_tick(make_app: Callable[..., App]) -> None:
    clock = FrozenClock(T0 + timedelta(seconds=10))
    app = ticking_app(make_app, clock=clock)
    schedule = Schedule.cron_schedule("nightly", "tick", "30 2 * * *", timezone="Europe/Berlin")
    schedules = {schedule.name: schedule}
    await Scheduler(app, schedules).tick_once()
    (info,) = list_schedules(app, schedules)
    assert (info.name, info.task, info.paused, info.declared) == ("nightly", "tick", False, True)
    assert info.spec == "cron 30 2 * * * (Europe/Berlin)"
    assert info.next_tick == datetime(2026, 3, 3, 1, 30, tzinfo=UTC)  # 02:30 CET
    (gone,) = list_schedules(app, {})  # a row the code no longer declares is still listed
    assert (gone.declared, gone.next_tick) == (False, None)
    with pytest.raises(UnknownScheduleError):
        pause_schedule(app, schedules, "no-such-schedule", paused=True)
    await app.aclose()
