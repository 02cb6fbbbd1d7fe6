"""The pure decisions of flow control (durable_tasks.flow.policy)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_tasks import InvalidFlowControlError
from durable_tasks.flow.policy import (
    GUARD_SHARE,
    PRIORITY_HEAD_START,
    PRIORITY_LEVELS,
    Limit,
    Rate,
    dispatch_due,
    guard_reserve,
    parse_rate,
    submit_flow,
    task_flow,
)


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("600/m", 600, timedelta(minutes=1)), ("20/s", 20, timedelta(seconds=1)), ("2.5 / h", 2.5, timedelta(hours=1))],
)
def test_a_rate_reads_as_count_per_period(text: str, count: float, period: timedelta) -> None:
    assert parse_rate(text) == Rate(count, period)


def test_a_rate_spaces_its_admissions_evenly_and_prints_as_written() -> None:
    assert parse_rate("3000/m").interval_ms == 20
    assert str(parse_rate("3000/m")) == "3000/m"


def test_the_guard_reserves_a_tenth_of_a_read_for_lower_levels() -> None:
    assert guard_reserve(50, 0) == 5
    assert guard_reserve(GUARD_SHARE, 3) == 1


def test_a_read_too_small_for_a_share_gives_every_tenth_one_to_the_lowest_level() -> None:
    reserved = [guard_reserve(4, reads) for reads in range(3 * GUARD_SHARE)]
    assert reserved.count(1) == 3
    assert reserved[GUARD_SHARE - 1] == 1
    assert set(reserved) == {0, 1}


def test_a_tasks_own_rate_and_count_make_one_limit_named_after_it() -> None:
    flow = task_flow("judge", priority=1, rate_limit="10/s", concurrency_limit=2)
    assert flow.priority == 1
    assert flow.limits == (Limit("task:judge", rate=Rate(10, timedelta(seconds=1)), concurrency=2),)
    assert flow.limited


def test_a_shared_limit_is_kept_as_given() -> None:
    shared = Limit("openai", rate=parse_rate("3000/m"), burst=10)
    assert task_flow("call", priority=None, rate_limit=shared, concurrency_limit=None).limits == (shared,)
    assert not task_flow("plain", priority=None, rate_limit=None, concurrency_limit=None).limited


@pytest.mark.parametrize("bad", [-1, PRIORITY_LEVELS, True, 1.5])
def test_a_priority_outside_the_levels_is_refused(bad: object) -> None:
    with pytest.raises(InvalidFlowControlError, match="priority="):
        task_flow("t", priority=bad, rate_limit=None, concurrency_limit=None)  # type: ignore[arg-type]


def test_a_submit_takes_the_tasks_level_unless_it_gives_one() -> None:
    flow = task_flow("t", priority=2, rate_limit=None, concurrency_limit=1)
    assert submit_flow(flow, "q", prioritized=True, priority=None, concurrency_key="u:1") == (2, "u:1")
    assert submit_flow(flow, "q", prioritized=True, priority=3, concurrency_key=None) == (3, None)


@pytest.mark.parametrize("key", ["", "x" * 201, "tab\there"])
def test_a_concurrency_key_must_be_printable_and_short(key: str) -> None:
    flow = task_flow("t", priority=None, rate_limit=None, concurrency_limit=1)
    with pytest.raises(InvalidFlowControlError, match="concurrency_key="):
        submit_flow(flow, "q", prioritized=False, priority=None, concurrency_key=key)


def test_a_limit_must_limit_something() -> None:
    with pytest.raises(InvalidFlowControlError, match="give rate=, concurrency= or both"):
        Limit("nothing")
    with pytest.raises(InvalidFlowControlError, match="burst=0"):
        Limit("zero", rate=parse_rate("1/s"), burst=0)


def test_a_level_goes_ahead_in_the_dispatch_order_but_a_delay_is_kept() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert dispatch_due(now, None, 2) == now - 2 * PRIORITY_HEAD_START
    assert dispatch_due(now, None, 0) is None
    later = now + timedelta(hours=1)
    assert dispatch_due(now, later, 3) == later
