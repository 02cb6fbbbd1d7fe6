"""Pure decisions: publish backoff, what a failed attempt leads to, what the reaper does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_tasks.policy import (
    FailureDecision,
    ReapAction,
    TaskLeaseView,
    backoff_delay,
    decide_after_failure,
    decide_reap,
    loss_counts,
    loss_suspects,
    pause_after_wait,
    suspect_group_limit,
)
from durable_tasks.records import TERMINAL_STATES, TaskState

SECOND = timedelta(seconds=1)
CAP = timedelta(seconds=60)

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=UTC)
LEASE = timedelta(seconds=10)
VISIBILITY = timedelta(minutes=30)
MAX_DELIVERIES = 5


# -- backoff_delay ------------------------------------------------------------------------


def test_enqueue_error_backs_off_and_caps_at_60s() -> None:
    """With jitter, every delay lies in [initial * 2**(n-1), that + jitter], never above the cap."""
    seen: list[timedelta] = []
    for failures in range(1, 200):
        delay = backoff_delay(failures, initial=SECOND, cap=CAP, jitter=SECOND)
        assert isinstance(delay, timedelta)
        assert delay <= CAP, f"failure {failures}: {delay} is above the 60 s cap"
        floor = min(SECOND * 2 ** min(failures - 1, 30), CAP)
        assert delay >= floor, f"failure {failures}: {delay} is below the exponential floor {floor}"
        if floor < CAP - SECOND:
            assert delay <= floor + SECOND, f"failure {failures}: {delay} exceeds floor + jitter"
        seen.append(delay)
    # The cap is reached and then held.
    assert all(d == CAP for d in seen[10:])


def test_backoff_without_jitter_doubles_exactly_then_holds_the_cap() -> None:
    delays = [backoff_delay(n, initial=SECOND, cap=CAP, jitter=timedelta(0)) for n in range(1, 10)]
    assert [d.total_seconds() for d in delays] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_backoff_scales_with_the_initial_delay() -> None:
    initial = timedelta(milliseconds=250)
    delays = [backoff_delay(n, initial=initial, cap=CAP, jitter=timedelta(0)) for n in range(1, 5)]
    assert delays == [initial, initial * 2, initial * 4, initial * 8]


@pytest.mark.parametrize("failures", [1_000, 10_000, 1_000_000])
def test_backoff_after_very_many_failures_is_exactly_the_cap(failures: int) -> None:
    """2**(n-1) overflows a float long before this: the answer must still be the cap."""
    assert backoff_delay(failures, initial=SECOND, cap=CAP, jitter=SECOND) == CAP


@pytest.mark.parametrize("failures", [1, 1_025, 1_000_000])
def test_no_backoff_stays_none_however_many_failures(failures: int) -> None:
    """An initial delay of zero: retry at once (plus jitter), through the longest outage."""
    assert backoff_delay(failures, initial=timedelta(0), cap=CAP, jitter=timedelta(0)) == timedelta(0)


def test_backoff_never_exceeds_a_cap_smaller_than_initial_plus_jitter() -> None:
    cap = timedelta(seconds=3)
    for _ in range(200):
        assert backoff_delay(1, initial=timedelta(seconds=5), cap=cap, jitter=timedelta(seconds=5)) <= cap


def test_backoff_jitter_is_random_and_bounded() -> None:
    delays = {backoff_delay(3, initial=SECOND, cap=CAP, jitter=SECOND) for _ in range(200)}
    assert len(delays) > 1, "jitter never varied the delay"
    assert all(timedelta(seconds=4) <= d <= timedelta(seconds=5) for d in delays)


# -- decide_after_failure ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "retryable", "expected"),
    [
        (1, 3, True, FailureDecision.RETRY),
        (2, 3, True, FailureDecision.RETRY),
        (3, 3, True, FailureDecision.FAIL),  # the last attempt failed
        (4, 3, True, FailureDecision.FAIL),  # over the limit (e.g. a reclaimed attempt)
        (1, 1, True, FailureDecision.FAIL),  # a single attempt never retries
        (1, 3, False, FailureDecision.FAIL),  # not retryable: fail at once
        (2, 3, False, FailureDecision.FAIL),
        (3, 3, False, FailureDecision.FAIL),
    ],
)
def test_decide_after_failure(attempt: int, max_attempts: int, retryable: bool, expected: FailureDecision) -> None:
    assert decide_after_failure(attempt=attempt, max_attempts=max_attempts, retryable=retryable) is expected


# -- decide_reap --------------------------------------------------------------------------


def view(
    state: TaskState = TaskState.ENQUEUED,
    *,
    generation: int = 0,
    delivery: int = 0,
    lease_expires_at: datetime | None = None,
    reclaims: int = 0,
    loss_counts: bool = True,
) -> TaskLeaseView:
    # Every loss counted so far (a worst case): counted_losses follows reclaims.
    return TaskLeaseView(
        state=state,
        generation=generation,
        delivery=delivery,
        lease_expires_at=lease_expires_at,
        reclaims=reclaims,
        counted_losses=reclaims,
        loss_counts=loss_counts,
    )


def reap(
    task: TaskLeaseView | None,
    *,
    idle: timedelta,
    entry_generation: int = 0,
    entry_delivery: int = 0,
    max_deliveries: int = MAX_DELIVERIES,
) -> ReapAction:
    return decide_reap(
        entry_generation=entry_generation,
        entry_delivery=entry_delivery,
        idle=idle,
        task=task,
        now=NOW,
        lease_timeout=LEASE,
        visibility_timeout=VISIBILITY,
        max_deliveries=max_deliveries,
    )


@pytest.mark.parametrize("state", [TaskState.ENQUEUED, TaskState.RUNNING, TaskState.PENDING])
def test_entry_of_an_older_generation_is_acked_as_stale(state: TaskState) -> None:
    # Even a live lease does not save it: that lease belongs to the newer generation.
    task = view(state, generation=2, lease_expires_at=NOW + LEASE)
    assert reap(task, entry_generation=1, idle=VISIBILITY * 2) is ReapAction.ACK_STALE
    assert reap(task, entry_generation=1, idle=timedelta(0)) is ReapAction.ACK_STALE


def test_entry_of_an_older_delivery_is_acked_as_stale() -> None:
    task = view(TaskState.ENQUEUED, delivery=3)
    assert reap(task, entry_delivery=2, idle=LEASE * 2) is ReapAction.ACK_STALE
    assert reap(task, entry_delivery=2, idle=timedelta(0)) is ReapAction.ACK_STALE


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_entry_of_a_finished_task_is_acked_as_stale(state: TaskState) -> None:
    task = view(state, reclaims=MAX_DELIVERIES + 3)  # even at the delivery limit: nothing is left to do
    assert reap(task, idle=LEASE * 2) is ReapAction.ACK_STALE
    assert reap(task, idle=timedelta(0)) is ReapAction.ACK_STALE


def test_terminal_states_are_exactly_the_finished_ones() -> None:
    assert set(TERMINAL_STATES) == {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED}


def test_running_task_with_a_live_lease_is_kept() -> None:
    task = view(TaskState.RUNNING, lease_expires_at=NOW + timedelta(seconds=1), reclaims=MAX_DELIVERIES - 1)
    # idle for several leases: the worker read the entry long ago but keeps heartbeating
    assert reap(task, idle=LEASE * 5) is ReapAction.KEEP


@pytest.mark.parametrize("state", [TaskState.PENDING, TaskState.ENQUEUED, TaskState.RETRYING, TaskState.RUNNING])
def test_entry_idle_for_less_than_a_lease_is_kept(state: TaskState) -> None:
    expired = NOW - timedelta(seconds=1) if state == TaskState.RUNNING else None
    task = view(state, lease_expires_at=expired)
    assert reap(task, idle=LEASE - timedelta(milliseconds=1)) is ReapAction.KEEP
    assert reap(task, idle=timedelta(0)) is ReapAction.KEEP


@pytest.mark.parametrize(
    "lease_expires_at",
    [NOW - timedelta(seconds=1), NOW],  # a lease ending exactly now is over (the claim fence says the same)
    ids=["expired", "expiring-now"],
)
def test_running_task_with_an_expired_lease_is_redelivered(lease_expires_at: datetime) -> None:
    task = view(TaskState.RUNNING, lease_expires_at=lease_expires_at)
    assert reap(task, idle=LEASE) is ReapAction.REDELIVER
    assert reap(task, idle=LEASE * 3) is ReapAction.REDELIVER


@pytest.mark.parametrize("state", [TaskState.PENDING, TaskState.ENQUEUED, TaskState.RETRYING])
def test_unclaimed_task_idle_past_a_lease_is_redelivered(state: TaskState) -> None:
    """The worker died after reading the entry but before claiming it."""
    assert reap(view(state), idle=LEASE) is ReapAction.REDELIVER


def test_reclaims_reaching_max_deliveries_dead_letter() -> None:
    expired = NOW - SECOND
    below = view(TaskState.RUNNING, lease_expires_at=expired, reclaims=MAX_DELIVERIES - 2)
    at = view(TaskState.RUNNING, lease_expires_at=expired, reclaims=MAX_DELIVERIES - 1)
    beyond = view(TaskState.ENQUEUED, reclaims=MAX_DELIVERIES + 4)
    assert reap(below, idle=LEASE) is ReapAction.REDELIVER
    assert reap(at, idle=LEASE) is ReapAction.DEAD_LETTER
    assert reap(beyond, idle=LEASE) is ReapAction.DEAD_LETTER


def test_a_bystander_loss_never_dead_letters() -> None:
    """An attempt lost while running beside others may have been killed by one of them: it is
    redelivered (to run alone) however many losses are on the record."""
    expired = NOW - SECOND
    bystander = view(TaskState.RUNNING, lease_expires_at=expired, reclaims=MAX_DELIVERIES + 4, loss_counts=False)
    assert reap(bystander, idle=LEASE) is ReapAction.REDELIVER


@pytest.mark.parametrize(
    ("state", "attempt", "solo_attempt", "counts"),
    [
        (TaskState.RUNNING, 2, 2, True),  # lost while running alone: its own loss
        (TaskState.RUNNING, 2, None, False),  # beside others: maybe a bystander
        (TaskState.RUNNING, 3, 2, False),  # an earlier attempt ran alone, this one did not
        (TaskState.ENQUEUED, 0, None, False),  # read, never claimed: no code of it ran
        (TaskState.PENDING, 1, 1, False),  # redelivered already; its solo attempt is history
    ],
)
def test_only_a_loss_while_running_alone_counts(
    state: TaskState, attempt: int, solo_attempt: int | None, counts: bool
) -> None:
    assert loss_counts(state, attempt, solo_attempt) is counts


@pytest.mark.parametrize(
    ("state", "started", "suspects"),
    [
        (TaskState.RUNNING, True, True),  # its code ran when the worker died
        (TaskState.RUNNING, False, False),  # claimed held: it waited at the gate, ran nothing
        (TaskState.ENQUEUED, False, False),  # read, never claimed
        (TaskState.ENQUEUED, True, False),  # an earlier attempt's start: this delivery ran nothing
    ],
)
def test_only_a_loss_of_a_started_attempt_makes_a_suspect(state: TaskState, started: bool, suspects: bool) -> None:
    assert loss_suspects(state, started) is suspects


def test_max_deliveries_of_one_dead_letters_the_first_lost_delivery() -> None:
    assert reap(view(TaskState.ENQUEUED), idle=LEASE, max_deliveries=1) is ReapAction.DEAD_LETTER


def test_dead_letter_waits_for_a_lost_worker_like_redelivery_does() -> None:
    """At the delivery limit, a live lease or a short idle still keeps the entry."""
    live = view(TaskState.RUNNING, lease_expires_at=NOW + SECOND, reclaims=MAX_DELIVERIES - 1)
    fresh = view(TaskState.ENQUEUED, reclaims=MAX_DELIVERIES - 1)
    assert reap(live, idle=LEASE * 2) is ReapAction.KEEP
    assert reap(fresh, idle=LEASE - SECOND) is ReapAction.KEEP


def test_entry_without_a_task_row_waits_for_the_visibility_timeout_then_dead_letters() -> None:
    assert reap(None, idle=timedelta(0)) is ReapAction.KEEP
    assert reap(None, idle=LEASE * 2) is ReapAction.KEEP  # idle past a lease is not enough
    assert reap(None, idle=VISIBILITY - SECOND) is ReapAction.KEEP
    assert reap(None, idle=VISIBILITY) is ReapAction.DEAD_LETTER
    assert reap(None, idle=VISIBILITY * 10) is ReapAction.DEAD_LETTER


@pytest.mark.parametrize(
    ("concurrency", "limits"),
    [
        (256, [256, 16, 1, 1]),  # the bystanders of one crash run together, then by 16, then alone
        (1000, [1000, 62, 3, 1]),
        (10, [10, 1, 1, 1]),
        (1, [1, 1, 1, 1]),
    ],
)
def test_suspect_groups_shrink_16x_with_each_loss_down_to_alone(concurrency: int, limits: list[int]) -> None:
    assert [suspect_group_limit(reclaims, concurrency) for reclaims in (1, 2, 3, 4)] == limits


def test_a_task_never_lost_is_no_suspect() -> None:
    with pytest.raises(ValueError, match="suspect"):
        suspect_group_limit(0, 256)


# -- pause_after_wait ----------------------------------------------------------------------

HEAD_START = timedelta(milliseconds=10)
POLL = timedelta(seconds=1)


@pytest.mark.parametrize("waited", [timedelta(0), timedelta(milliseconds=3), POLL - timedelta(microseconds=1)])
def test_a_wait_ended_by_a_wake_up_gives_the_workers_their_head_start(waited: timedelta) -> None:
    assert pause_after_wait(head_start=HEAD_START, waited=waited, timeout=POLL) == HEAD_START


@pytest.mark.parametrize("waited", [POLL, POLL + timedelta(milliseconds=2)])
def test_a_wait_that_ran_to_a_due_time_or_the_poll_passes_at_once(waited: timedelta) -> None:
    """A delayed row keeps its precision: its due time ended the wait, not a submit."""
    assert pause_after_wait(head_start=HEAD_START, waited=waited, timeout=POLL) == timedelta(0)


def test_without_publish_at_commit_a_wake_up_passes_at_once() -> None:
    """No entry went out at commit: the dispatcher's pass is the publish, so it starts at once."""
    assert pause_after_wait(head_start=None, waited=timedelta(0), timeout=POLL) == timedelta(0)
