"""Pure flow-control decisions: priority levels, the starvation guard, rates and limits.

Nothing here does I/O; the worker, the dispatcher and the App ask these functions and act.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..errors import InvalidFlowControlError
from ..settings import printable_text

__all__ = [
    "CONCURRENCY_RETRY",
    "GUARD_SHARE",
    "NO_FLOW",
    "PRIORITY_HEAD_START",
    "PRIORITY_LEVELS",
    "Limit",
    "Rate",
    "TaskFlow",
    "check_concurrency_key",
    "check_partition_key",
    "check_priority",
    "dispatch_due",
    "guard_reserve",
    "parse_rate",
    "submit_flow",
    "task_flow",
]

#: Priority levels 0 (the default) to 3 (first served). Few on purpose: each level is one more
#: stream per queue partition that workers read, the reaper scans and the trim walks.
PRIORITY_LEVELS = 4

#: The starvation guard: a prioritized read of ``n`` entries takes ``n // GUARD_SHARE`` of them
#: lowest level first, so lower levels keep at least that share of the reads while higher ones
#: are backlogged; a read too small for a share (``n < GUARD_SHARE``) gives every
#: ``GUARD_SHARE``-th read's first entry to the lowest level that has one.
GUARD_SHARE = 10

#: How far ahead of level 0 each level is in the dispatcher's due order: a prioritized task due
#: now is recorded as due this much earlier per level, so the claim, which takes due rows
#: oldest first through its index, takes it before a backlog of lower rows up to this old.
PRIORITY_HEAD_START = timedelta(days=1)

#: The first wait of a delivery refused by a busy concurrency key; the n-th refused for one key
#: in one admission call waits n times as long, so a key's backlog comes back spread out.
CONCURRENCY_RETRY = timedelta(milliseconds=250)

_MAX_KEY = 200
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(ms|s|sec|second|m|min|minute|h|hour|d|day)\s*$")
_PERIODS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "sec": timedelta(seconds=1),
    "second": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "min": timedelta(minutes=1),
    "minute": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "hour": timedelta(hours=1),
    "d": timedelta(days=1),
    "day": timedelta(days=1),
}


def check_priority(priority: int) -> int:
    """``priority`` if it is a level (0 to PRIORITY_LEVELS - 1), else InvalidFlowControlError."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority < PRIORITY_LEVELS:
        raise InvalidFlowControlError(
            f"priority={priority!r}: pass an int from 0 (default) to {PRIORITY_LEVELS - 1} (served first)"
        )
    return priority


def check_concurrency_key(key: str) -> str:
    """``key`` if it can name a concurrency slot set, else InvalidFlowControlError."""
    return _printable_key("concurrency_key", key)


def check_partition_key(key: str | None) -> str | None:
    """``key`` if it can pick a partitioned queue's stream (None: the task id picks it), else
    InvalidFlowControlError: not a NUL byte or a lone surrogate for the driver to refuse, nor
    a key longer than its column for one database to refuse and another to keep."""
    return None if key is None else _printable_key("partition_key", key)


def _printable_key(what: str, key: str) -> str:
    if not printable_text(key, _MAX_KEY):
        raise InvalidFlowControlError(
            f"{what}={str(key)[:40]!r}: pass a printable string of 1-{_MAX_KEY} characters, e.g. 'user:42'"
        )
    return key


def guard_reserve(count: int, reads: int) -> int:
    """How many entries of a read of ``count`` are taken lowest level first; ``reads`` counts
    the prioritized reads this consumer made before (see :data:`GUARD_SHARE`)."""
    reserve = count // GUARD_SHARE
    if reserve == 0 and count > 0 and reads % GUARD_SHARE == GUARD_SHARE - 1:
        return 1
    return reserve


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` admissions per ``period``, evenly spaced (GCRA's emission interval)."""

    count: float
    period: timedelta

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two admissions at the steady rate."""
        return self.period.total_seconds() * 1000 / self.count

    def __str__(self) -> str:
        seconds = self.period.total_seconds()
        unit = {1.0: "s", 60.0: "m", 3600.0: "h", 86400.0: "d", 0.001: "ms"}.get(seconds, f"{seconds}s")
        return f"{self.count:g}/{unit}"


def parse_rate(text: str | Rate) -> Rate:
    """``"600/m"``, ``"20/s"``, ``"10/h"`` as a :class:`Rate`; InvalidFlowControlError otherwise."""
    if isinstance(text, Rate):
        return text
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise InvalidFlowControlError(f"rate {text!r}: write '<count>/<s|m|h|d>' with a count above 0, e.g. '600/m'")
    return Rate(float(match.group(1)), _PERIODS[match.group(2)])


@dataclass(frozen=True, slots=True)
class Limit:
    """A named limit: a rate (with ``burst`` admissions at once), a concurrency (running
    attempts per concurrency key), or both. ``App.limit`` makes shared ones; a task's
    ``rate_limit="600/m"`` or ``concurrency_limit=2`` makes one named ``task:<name>``."""

    name: str
    rate: Rate | None = None
    burst: int = 1
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if not printable_text(self.name, _MAX_KEY):
            raise InvalidFlowControlError(f"limit name {self.name[:40]!r}: 1-{_MAX_KEY} printable characters")
        if self.burst < 1:
            raise InvalidFlowControlError(f"limit {self.name!r}: burst={self.burst} must be 1 or more")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidFlowControlError(f"limit {self.name!r}: concurrency={self.concurrency} must be 1 or more")
        if self.rate is None and self.concurrency is None:
            raise InvalidFlowControlError(f"limit {self.name!r}: give rate=, concurrency= or both")


@dataclass(frozen=True, slots=True)
class TaskFlow:
    """What ``@app.task`` declared about a task's flow: its default priority (None: its queue
    has no levels unless another task's declares one), and the limits admission checks."""

    priority: int | None = None
    limits: tuple[Limit, ...] = ()

    @property
    def limited(self) -> bool:
        """Whether admission must ask Redis before this task runs."""
        return bool(self.limits)


#: A task that declares nothing: no level, no limit, no admission round trip.
NO_FLOW = TaskFlow()


def task_flow(
    task_name: str,
    *,
    priority: int | None,
    rate_limit: str | Rate | Limit | None,
    concurrency_limit: int | Limit | None,
) -> TaskFlow:
    """What ``@app.task(priority=…, rate_limit=…, concurrency_limit=…)`` declares: a rate or
    count gives the task a limit of its own (``task:<name>``); a :class:`Limit` is shared."""
    if priority is not None:
        check_priority(priority)
    limits: list[Limit] = []
    own_rate: Rate | None = None
    own_concurrency: int | None = None
    if isinstance(rate_limit, Limit):
        limits.append(rate_limit)
    elif rate_limit is not None:
        own_rate = parse_rate(rate_limit)
    if isinstance(concurrency_limit, Limit):
        limits.append(concurrency_limit)
    elif concurrency_limit is not None:
        if isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int):
            raise InvalidFlowControlError(f"concurrency_limit={concurrency_limit!r}: pass an int or an app.limit(...)")
        own_concurrency = concurrency_limit
    if own_rate is not None or own_concurrency is not None:  # the task's own: one limit, task:<name>
        limits.append(Limit(f"task:{task_name}", rate=own_rate, concurrency=own_concurrency))
    for limit in limits:
        if limit.rate is None and limit.concurrency is None:
            raise InvalidFlowControlError(f"limit {limit.name!r} limits nothing")
    return TaskFlow(priority, tuple(limits))


def submit_flow(
    flow: TaskFlow, queue: str, *, prioritized: bool, priority: int | None, concurrency_key: str | None
) -> tuple[int | None, str | None]:
    """The (priority, concurrency key) a submit records, checked: a priority needs a queue
    with levels (a task of it declares ``priority=``), a key needs a concurrency limit."""
    if priority is None:
        priority = flow.priority
    elif not prioritized:
        raise InvalidFlowControlError(
            f"queue {queue!r} has no priority levels: declare @app.task(priority=0) on a task of it"
        )
    else:
        check_priority(priority)
    if concurrency_key is not None:
        check_concurrency_key(concurrency_key)
        if not any(limit.concurrency is not None for limit in flow.limits):
            raise InvalidFlowControlError(
                "concurrency_key= needs a concurrency limit on the task: @app.task(concurrency_limit=...)"
            )
    return priority, concurrency_key


def dispatch_due(now: datetime, due: datetime | None, priority: int | None) -> datetime | None:
    """When the dispatcher may take a new task's first delivery: ``due`` as given for a delayed
    task (a priority never makes it early); for one due now, ``now`` less the head start of its
    level (:data:`PRIORITY_HEAD_START`), so dispatch order respects priority too."""
    if due is not None or not priority:
        return due
    return now - PRIORITY_HEAD_START * priority
