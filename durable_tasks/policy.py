"""Pure decisions of the runtime: backoff, what a failure leads to, what the reaper does.

Nothing here performs I/O or reads the clock; loops pass facts in and act on the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

import tenacity

from .records import TERMINAL_STATES, TaskState

__all__ = [
    "FailureDecision",
    "ReapAction",
    "TaskLeaseView",
    "backoff_delay",
    "decide_after_failure",
    "decide_reap",
    "loss_counts",
    "loss_suspects",
    "pause_after_wait",
    "suspect_group_limit",
]


_CURVE_TOP = 64


def backoff_delay(failures: int, *, initial: timedelta, cap: timedelta, jitter: timedelta) -> timedelta:
    """Delay before the next try after ``failures`` consecutive failures (1 = first failure).

    Exponential (initial * 2**(failures-1)) plus random jitter, never above ``cap``; tenacity's
    wait strategy computes it so the curve is the one its users know.
    """
    wait = tenacity.wait_exponential_jitter(
        multiplier=initial.total_seconds(),
        max=cap.total_seconds(),
        jitter=jitter.total_seconds(),
    )
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    # Past 64 failures the curve is far above any cap (2**63 microseconds: 292,000 years); and
    # tenacity answers its maximum when 2**n overflows a float, which an initial of zero (no
    # backoff) would reach after 1,025 failures of a long outage.
    state.attempt_number = min(max(1, failures), _CURVE_TOP)
    return min(timedelta(seconds=wait(state)), cap)


class FailureDecision(Enum):
    """What a failed attempt leads to."""

    RETRY = "retry"
    FAIL = "fail"


def decide_after_failure(*, attempt: int, max_attempts: int, retryable: bool) -> FailureDecision:
    """Retry while attempts remain and the error is retryable; otherwise the task FAILS."""
    if retryable and attempt < max_attempts:
        return FailureDecision.RETRY
    return FailureDecision.FAIL


@dataclass(frozen=True, slots=True)
class TaskLeaseView:
    """What the reaper knows from the database about the task behind a pending entry."""

    state: TaskState
    generation: int
    delivery: int
    lease_expires_at: datetime | None
    reclaims: int
    #: Lost deliveries that count toward ``max_deliveries`` (see :func:`loss_counts`).
    counted_losses: int = 0
    #: Whether losing this delivery counts toward ``max_deliveries`` (:func:`loss_counts`).
    loss_counts: bool = True


def loss_counts(state: TaskState, attempt: int, solo_attempt: int | None) -> bool:
    """Whether losing the current delivery is charged to the task (toward ``max_deliveries``).

    Only when its attempt ran alone (a worker marked it solo, and it is still RUNNING): then
    nothing else can have killed the worker. An attempt lost beside others may be a bystander
    of the one that did; it only becomes a suspect, which the worker runs with other suspects
    only, in groups that shrink with each loss until it runs alone
    (:func:`suspect_group_limit`). A delivery lost before any worker claimed it ran no code
    of the task at all (an entry carries ids, not the payload; a malformed one goes to the DLQ
    without a crash), so its loss is the infrastructure's, like a broker's data loss.
    """
    return state == TaskState.RUNNING and solo_attempt == attempt


def loss_suspects(state: TaskState, started: bool) -> bool:
    """Whether losing the current delivery makes the task (more) suspect (``reclaims + 1``).

    Only when its attempt had started: a worker claims an attempt *held* (not started) when it
    must wait at the isolation gate first (every suspect does, and any attempt claimed while
    the worker isolates), and records the start just before the task's code runs. A worker
    killed meanwhile, by the group it waited for, ran none of the held task's code, so that
    loss tells nothing about the task. Counting it made every kill promote the whole queue
    waiting behind a group of suspects: their limits shrank, more of them waited, and more of
    them were lost with the next kill (the reason is in docs/reliability.md's rules).
    """
    return state == TaskState.RUNNING and started


def suspect_group_limit(reclaims: int, concurrency: int) -> int:
    """How many suspects (tasks with ``reclaims > 0``) may run together, this one included.

    Group testing: the tasks lost with one worker run together again, with other suspects only,
    in groups that shrink by 16x with each further loss (``concurrency`` 256: 256, 16, then 1).
    The bystanders of one crash finish in one worker life instead of one after another, while a
    task that kills every worker it runs on is alone after a few lives, where its losses count
    (:func:`loss_counts`: the worker marks an attempt solo only when its limit is 1).
    """
    if reclaims <= 0:
        raise ValueError("only a suspect (reclaims > 0) has a group limit")
    return max(1, concurrency >> (4 * (reclaims - 1)))


def pause_after_wait(*, head_start: timedelta | None, waited: timedelta, timeout: timedelta) -> timedelta:
    """How long the dispatcher waits, after its wait for work returned, before its next pass.

    ``head_start`` is set where submits publish their entries at commit: a wait that ended
    before its ``timeout`` was ended by a submit's wake-up, whose entries are usually out
    already, so the pass leaves the cores to the workers' claims of them for ``head_start``
    (and takes the rows submitted meanwhile with it). A wait that ran to its timeout ended at a
    row's due time or the poll interval: the pass starts at once, so delayed rows keep their
    precision.
    """
    if head_start is None or waited >= timeout:
        return timedelta(0)
    return head_start


class ReapAction(Enum):
    """What the reaper does with one pending stream entry."""

    KEEP = "keep"  # its worker may still be alive
    ACK_STALE = "ack_stale"  # the database has moved on: the entry carries nothing to do
    REDELIVER = "redeliver"  # new delivery through the outbox, then ack the old entry
    DEAD_LETTER = "dead_letter"  # too many lost deliveries: DLQ + task DEAD


def decide_reap(
    *,
    entry_generation: int,
    entry_delivery: int,
    idle: timedelta,
    task: TaskLeaseView | None,
    now: datetime,
    lease_timeout: timedelta,
    visibility_timeout: timedelta,
    max_deliveries: int,
) -> ReapAction:
    """Decide the fate of a pending entry idle for ``idle``.

    An entry is recovered when the database says nobody holds its task (no live lease) and it
    has been idle at least one lease: a dead worker is noticed in seconds, not after the
    visibility timeout. An entry whose task row is missing waits for the visibility timeout
    (the database may be restoring) and is then dead-lettered.
    """
    if task is None:
        return ReapAction.DEAD_LETTER if idle >= visibility_timeout else ReapAction.KEEP
    if task.state in TERMINAL_STATES or task.generation != entry_generation or task.delivery != entry_delivery:
        return ReapAction.ACK_STALE
    if task.state == TaskState.WAITING:
        return ReapAction.ACK_STALE  # suspended: its resume makes a delivery of its own
    lease_live = task.lease_expires_at is not None and task.lease_expires_at > now
    if task.state == TaskState.RUNNING and lease_live:
        return ReapAction.KEEP
    if idle < lease_timeout:
        return ReapAction.KEEP
    if task.loss_counts and task.counted_losses + 1 >= max_deliveries:
        return ReapAction.DEAD_LETTER
    return ReapAction.REDELIVER
