"""Schedules and their ticks: pure computation with the time passed in (no clock, no sleep)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from durable_tasks.errors import ConfigurationError
from durable_tasks.periodic import TICK, Schedule, plan_ticks

BERLIN = ZoneInfo("Europe/Berlin")
GRACE = timedelta(seconds=30)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[arg-type,misc]


def cron(expression: str, timezone: str = "UTC", **kw: object) -> Schedule:
    return Schedule.cron_schedule("s", "task", expression, timezone=timezone, **kw)  # type: ignore[arg-type]


def every(seconds: int, **kw: object) -> Schedule:
    return Schedule.interval("s", "task", timedelta(seconds=seconds), **kw)  # type: ignore[arg-type]


# -- ticks ----------------------------------------------------------------------------------


def test_cron_next_tick_is_strictly_after() -> None:
    s = cron("*/5 * * * *")
    assert s.next_tick(utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 5)
    assert s.next_tick(utc(2026, 1, 1, 12, 4, 59)) == utc(2026, 1, 1, 12, 5)


def test_six_fields_tick_every_second() -> None:
    s = cron("* * * * * *")
    assert s.ticks(utc(2026, 1, 1, 12, 0, 0), utc(2026, 1, 1, 12, 0, 3), limit=10) == [
        utc(2026, 1, 1, 12, 0, 1),
        utc(2026, 1, 1, 12, 0, 2),
        utc(2026, 1, 1, 12, 0, 3),
    ]


def test_latest_tick_includes_the_instant_itself() -> None:
    s = cron("0 * * * *")
    assert s.latest_tick(utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 0)
    assert s.latest_tick(utc(2026, 1, 1, 12, 59, 59, 999)) == utc(2026, 1, 1, 12, 0)


def test_interval_ticks_are_counted_from_the_epoch_so_every_process_agrees() -> None:
    s = every(30)
    assert s.next_tick(utc(2026, 1, 1, 12, 0, 10)) == utc(2026, 1, 1, 12, 0, 30)
    assert s.next_tick(utc(2026, 1, 1, 12, 0, 30)) == utc(2026, 1, 1, 12, 1, 0)
    assert s.latest_tick(utc(2026, 1, 1, 12, 0, 59)) == utc(2026, 1, 1, 12, 0, 30)


def test_cron_is_read_in_the_schedules_time_zone() -> None:
    s = cron("0 9 * * *", "Europe/Berlin")
    assert s.next_tick(utc(2026, 1, 15, 0, 0)) == utc(2026, 1, 15, 8, 0)  # CET, UTC+1
    assert s.next_tick(utc(2026, 7, 15, 0, 0)) == utc(2026, 7, 15, 7, 0)  # CEST, UTC+2


FIXED_TIME = pytest.mark.parametrize("expression", ["30 2 * * *", "0 30 2 * * *"], ids=["five-fields", "six-fields"])


@FIXED_TIME
def test_spring_forward_runs_a_job_of_the_skipped_hour_once_right_after_the_gap(expression: str) -> None:
    # 2026-03-29, Berlin: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    s = cron(expression, "Europe/Berlin")
    assert s.ticks(utc(2026, 3, 28, 12), utc(2026, 3, 30, 12), limit=10) == [
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, at the end of the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


@FIXED_TIME
def test_fall_back_runs_a_fixed_time_job_once_in_the_repeated_hour(expression: str) -> None:
    # 2026-10-25, Berlin: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    s = cron(expression, "Europe/Berlin")
    assert s.ticks(utc(2026, 10, 24, 12), utc(2026, 10, 26, 12), limit=10) == [
        utc(2026, 10, 25, 0, 30),  # the first 02:30 (CEST) only
        utc(2026, 10, 26, 1, 30),
    ]


def test_fall_back_from_inside_the_repeated_hour_does_not_go_back_in_time() -> None:
    # A scheduler that starts in the second 02:10 (CET) must not answer the first 02:30 (CEST),
    # which is already past.
    s = cron("30 2 * * *", "Europe/Berlin")
    second_0210 = datetime(2026, 10, 25, 2, 10, tzinfo=BERLIN, fold=1).astimezone(UTC)
    assert s.next_tick(second_0210) == utc(2026, 10, 26, 1, 30)


@FIXED_TIME
def test_the_latest_tick_from_the_second_pass_of_the_repeated_hour_is_that_nights(expression: str) -> None:
    # At 02:10 CET (the second pass), 02:30 CEST (the first) is forty minutes past: walking
    # back in wall time from 02:10 would find the night before's 02:30.
    s = cron(expression, "Europe/Berlin")
    second_0210 = datetime(2026, 10, 25, 2, 10, tzinfo=BERLIN, fold=1).astimezone(UTC)
    assert s.latest_tick(second_0210) == utc(2026, 10, 25, 0, 30)
    assert s.latest_tick(utc(2026, 10, 25, 0, 29)) == utc(2026, 10, 24, 0, 30)


def test_latest_after_downtime_that_ends_in_the_repeated_hour_submits_that_nights_tick_at_once() -> None:
    s = cron("30 2 * * *", "Europe/Berlin", catch_up="latest")
    second_0210 = datetime(2026, 10, 25, 2, 10, tzinfo=BERLIN, fold=1).astimezone(UTC)
    for last_tick in (utc(2026, 10, 24, 0, 30), utc(2026, 10, 23, 0, 30)):  # one night missed, or two
        plan = plan_ticks(s, last_tick=last_tick, now=second_0210, grace=GRACE, limit=100)
        assert plan.submit == (utc(2026, 10, 25, 0, 30),)
        assert plan.last_tick == utc(2026, 10, 25, 0, 30)


def test_fall_back_runs_an_hourly_job_in_both_passes_of_the_repeated_hour() -> None:
    s = cron("0 * * * *", "Europe/Berlin")
    ticks = s.ticks(utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2, 30), limit=10)
    assert ticks == [utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 2)]


def test_a_tick_is_keyed_by_schedule_and_instant() -> None:
    s = cron("* * * * *")
    assert s.idempotency_key(utc(2026, 1, 1, 12, 0)) == "periodic:s@2026-01-01T12:00:00Z"
    other = Schedule.cron_schedule("t", "task", "* * * * *")
    assert other.idempotency_key(utc(2026, 1, 1, 12, 0)) != s.idempotency_key(utc(2026, 1, 1, 12, 0))


def test_the_default_payload_is_the_tick_and_a_fixed_one_is_kept() -> None:
    assert cron("* * * * *").payload is TICK
    assert cron("* * * * *").payload_for(utc(2026, 1, 1)) == utc(2026, 1, 1)
    assert cron("* * * * *", payload={"region": "eu"}).payload_for(utc(2026, 1, 1)) == {"region": "eu"}


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: cron("61 * * * *"), "not a cron expression"),
        (lambda: cron("* * *"), "not a cron expression"),
        (lambda: cron("* * * * *", "Mars/Olympus"), "unknown time zone"),
        (lambda: cron("* * * * *", catch_up="some"), "catch_up"),
        (lambda: every(0), "whole number of seconds"),
        (lambda: Schedule.interval("s", "task", timedelta(milliseconds=1500)), "whole number of seconds"),
        (lambda: Schedule.cron_schedule("", "task", "* * * * *"), "schedule name"),
        (lambda: Schedule.cron_schedule("nightly\x00", "task", "* * * * *"), "printable"),
        (lambda: Schedule.cron_schedule("nightly\udcff", "task", "* * * * *"), "printable"),
        (lambda: Schedule.cron_schedule("night\u200bly", "task", "* * * * *"), "printable"),  # zero-width space
        (lambda: Schedule.cron_schedule("n" * 201, "task", "* * * * *"), "1-200 characters"),
    ],
)
def test_a_bad_schedule_is_a_configuration_error(build: object, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        build()  # type: ignore[operator]


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="naive"):
        cron("* * * * *").next_tick(datetime(2026, 1, 1))


# -- catch-up ------------------------------------------------------------------------------


def test_an_on_time_tick_is_submitted_under_every_policy() -> None:
    for policy in ("latest", "all", "none"):
        s = every(1, catch_up=policy)
        plan = plan_ticks(
            s, last_tick=utc(2026, 1, 1, 12, 0, 0), now=utc(2026, 1, 1, 12, 0, 1, 3000), grace=GRACE, limit=100
        )
        assert plan.submit == (utc(2026, 1, 1, 12, 0, 1),)
        assert plan.last_tick == utc(2026, 1, 1, 12, 0, 1)
        assert plan.skipped_from is None


def test_nothing_due_changes_nothing() -> None:
    plan = plan_ticks(
        every(60), last_tick=utc(2026, 1, 1, 12, 0), now=utc(2026, 1, 1, 12, 0, 59), grace=GRACE, limit=100
    )
    assert not plan.moves
    assert plan.last_tick == utc(2026, 1, 1, 12, 0)


def test_latest_after_downtime_submits_the_most_recent_missed_tick_once() -> None:
    s = cron("0 * * * *", catch_up="latest")
    plan = plan_ticks(s, last_tick=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 9, 20), grace=GRACE, limit=100)
    assert plan.submit == (utc(2026, 1, 1, 9),)
    assert plan.last_tick == utc(2026, 1, 1, 9)
    assert plan.skipped_from == utc(2026, 1, 1, 4)


def test_latest_with_an_on_time_tick_needs_no_extra_run() -> None:
    s = cron("0 * * * *", catch_up="latest")
    plan = plan_ticks(s, last_tick=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 9, 0, 5), grace=GRACE, limit=100)
    assert plan.submit == (utc(2026, 1, 1, 9),)
    assert plan.skipped_from == utc(2026, 1, 1, 4)


def test_all_submits_every_missed_tick_in_chunks() -> None:
    s = cron("0 * * * *", catch_up="all")
    last, now = utc(2026, 1, 1, 3), utc(2026, 1, 1, 9, 20)
    submitted: list[datetime] = []
    while (plan := plan_ticks(s, last_tick=last, now=now, grace=GRACE, limit=4)).moves:
        submitted += plan.submit
        last = plan.last_tick
    assert submitted == [utc(2026, 1, 1, h) for h in range(4, 10)]


def test_none_skips_missed_ticks_and_keeps_on_time_ones() -> None:
    s = every(10, catch_up="none")
    plan = plan_ticks(s, last_tick=utc(2026, 1, 1, 12, 0, 0), now=utc(2026, 1, 1, 12, 5, 5), grace=GRACE, limit=100)
    assert plan.submit == (utc(2026, 1, 1, 12, 4, 40), utc(2026, 1, 1, 12, 4, 50), utc(2026, 1, 1, 12, 5, 0))
    assert plan.skipped_from == utc(2026, 1, 1, 12, 0, 10)
    late = plan_ticks(
        cron("0 * * * *", catch_up="none"),
        last_tick=utc(2026, 1, 1, 3),
        now=utc(2026, 1, 1, 9, 20),
        grace=GRACE,
        limit=9,
    )
    assert late.submit == ()
    assert late.last_tick == utc(2026, 1, 1, 9)  # stepped over: never submitted later


def test_a_scheduler_whose_clock_is_behind_submits_nothing_twice() -> None:
    plan = plan_ticks(
        every(1), last_tick=utc(2026, 1, 1, 12, 0, 5), now=utc(2026, 1, 1, 12, 0, 4, 900_000), grace=GRACE, limit=9
    )
    assert not plan.moves
