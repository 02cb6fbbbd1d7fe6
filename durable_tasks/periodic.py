"""Periodic tasks, the pure part: a schedule, its ticks, and what to submit after a gap.

A schedule's ticks are a function of the schedule alone, the same in every process: a cron
expression read in the schedule's time zone (by `cronsim`_, which follows Debian cron, DST
transitions included), or a fixed interval counted from the Unix epoch. So every scheduler
computes the same ticks, and a tick's time inside the idempotency key of its submit makes
"one submit per tick" fall out of the existing deduplication, however many schedulers run.

Nothing here touches a database or a clock: the scheduler (:mod:`durable_tasks.scheduler`)
passes ``now`` in.

.. _cronsim: https://github.com/cuu508/cronsim
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Final, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ConfigurationError
from .settings import printable_text

__all__ = ["TICK", "CatchUp", "Schedule", "TickPlan", "plan_ticks"]

#: What a scheduler does with ticks it missed (no scheduler ran at their time):
#: ``latest`` submits only the most recent of them, ``all`` submits each one, ``none`` skips them.
CatchUp = Literal["latest", "all", "none"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_NAME = 200  # dt_schedules.name, dt_tasks.name
_SECOND: Final = timedelta(seconds=1)


class _Tick:
    """The default payload marker: the task receives its tick's time."""

    def __repr__(self) -> str:
        return "TICK"


#: ``payload=TICK`` (the default) makes each submit's payload the tick's time (aware UTC).
TICK: Final = _Tick()


@dataclass(frozen=True, slots=True)
class Schedule:
    """When one task is submitted: a cron expression in a time zone, or a fixed interval.

    Build it with :meth:`cron_schedule` or :meth:`interval`, which check every field and raise
    :class:`~durable_tasks.errors.ConfigurationError` with what to change.
    """

    name: str
    task: str
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    catch_up: CatchUp = "latest"
    payload: Any = TICK
    _zone: tzinfo = field(default=UTC, repr=False, compare=False)

    @classmethod
    def cron_schedule(
        cls,
        name: str,
        task: str,
        expression: str,
        *,
        timezone: str = "UTC",
        catch_up: CatchUp = "latest",
        payload: Any = TICK,
    ) -> Schedule:
        """A cron schedule: five fields (minute precision) or six (a leading seconds field),
        read in ``timezone`` (an IANA name such as ``"Europe/Paris"``)."""
        _check_common(name, task, catch_up)
        zone = _zone(timezone, name)
        try:
            CronSim(expression, datetime.now(zone))
        except CronSimError as exc:
            raise ConfigurationError(
                f"schedule {name!r}: {expression!r} is not a cron expression ({exc}); "
                "use five fields 'minute hour day month weekday', or six with a leading seconds field"
            ) from exc
        return cls(name, task, cron=expression, timezone=timezone, catch_up=catch_up, payload=payload, _zone=zone)

    @classmethod
    def interval(
        cls, name: str, task: str, every: timedelta, *, catch_up: CatchUp = "latest", payload: Any = TICK
    ) -> Schedule:
        """A tick every ``every`` (whole seconds, at least one), counted from the Unix epoch in
        UTC: ``every=timedelta(hours=1)`` ticks on the hour, UTC."""
        _check_common(name, task, catch_up)
        if every < _SECOND or every % _SECOND:
            raise ConfigurationError(
                f"schedule {name!r}: every={every!r} must be a whole number of seconds, at least 1"
            )
        return cls(name, task, every=every, catch_up=catch_up, payload=payload)

    @property
    def spec(self) -> str:
        """How the schedule reads in listings: ``cron */5 * * * * (Europe/Paris)``, ``every 30s``."""
        if self.every is not None:
            return f"every {int(self.every.total_seconds())}s"
        return f"cron {self.cron} ({self.timezone})"

    def next_tick(self, after: datetime) -> datetime | None:
        """The first tick strictly after ``after`` (aware UTC); None if there is none (a cron
        expression that matches no date in the next fifty years)."""
        after = _utc(after)
        if self.every is not None:
            return _EPOCH + ((after - _EPOCH) // self.every + 1) * self.every
        assert self.cron is not None
        # Around a DST fall-back a fixed-time job's wall time may already have passed (it runs
        # once, in the first pass of the repeated hour): skip whatever is not after.
        for tick in _cron_ticks(self.cron, self._zone, after):
            if tick > after:
                return tick
        return None

    def latest_tick(self, at: datetime) -> datetime | None:
        """The last tick at or before ``at`` (aware UTC); None if there is none."""
        at = _utc(at)
        if self.every is not None:
            return _EPOCH + ((at - _EPOCH) // self.every) * self.every
        assert self.cron is not None
        # cronsim's reverse walk starts strictly before its start: start one second past `at`.
        start = at.replace(microsecond=0) + _SECOND
        latest = next((tick for tick in _cron_ticks(self.cron, self._zone, start, reverse=True) if tick <= at), None)
        # Walking back in wall time steps over a fixed-time tick when `at` is in the second pass
        # of a repeated hour, before the tick's wall time (its first pass is already over): the
        # forward walk, which places ticks in real time, finds what lies between.
        while latest is not None and (following := self.next_tick(latest)) is not None and following <= at:
            latest = following
        return latest

    def ticks(self, after: datetime, until: datetime, *, limit: int) -> list[datetime]:
        """Up to ``limit`` ticks in ``(after, until]``, oldest first."""
        found: list[datetime] = []
        tick = self.next_tick(after)
        while tick is not None and tick <= until and len(found) < limit:
            found.append(tick)
            tick = self.next_tick(tick)
        return found

    def idempotency_key(self, tick: datetime) -> str:
        """The idempotency key of this schedule's submit for ``tick``: equal in every process."""
        return f"periodic:{self.name}@{_utc(tick).strftime('%Y-%m-%dT%H:%M:%SZ')}"

    def payload_for(self, tick: datetime) -> Any:
        """The payload submitted for ``tick``: the tick's time, or the schedule's fixed payload."""
        return _utc(tick) if self.payload is TICK else self.payload


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What a scheduler does now for one schedule: submit ``submit`` (oldest first) and record
    ``last_tick`` as handled. ``skipped_from`` is the first missed tick left out, if any."""

    submit: tuple[datetime, ...]
    last_tick: datetime
    skipped_from: datetime | None = None

    @property
    def moves(self) -> bool:
        """Whether anything changes: a tick to submit or a missed tick to step over."""
        return bool(self.submit) or self.skipped_from is not None


def plan_ticks(schedule: Schedule, *, last_tick: datetime, now: datetime, grace: timedelta, limit: int) -> TickPlan:
    """The ticks due after ``last_tick`` up to ``now``, under the schedule's catch-up policy.

    A tick at most ``grace`` old is on time and always submitted. Older ones were missed (no
    scheduler ran then): ``all`` submits them, up to ``limit`` per call (the caller calls again
    with the new ``last_tick``); ``latest`` submits the most recent of them unless an on-time
    tick follows it (that tick is the run after the gap); ``none`` submits none of them.
    """
    last_tick, now = _utc(last_tick), _utc(now)
    on_time_after = max(last_tick, now - grace)
    if schedule.catch_up == "all" or on_time_after == last_tick:
        due = schedule.ticks(last_tick, now, limit=limit)
        return TickPlan(tuple(due), due[-1] if due else last_tick)
    on_time = schedule.ticks(on_time_after, now, limit=limit)
    latest_missed = schedule.latest_tick(on_time_after)
    if latest_missed is None or latest_missed <= last_tick:  # nothing was missed
        return TickPlan(tuple(on_time), on_time[-1] if on_time else last_tick)
    first_missed = schedule.next_tick(last_tick)
    if schedule.catch_up == "latest" and not on_time:
        skipped = first_missed if first_missed is not None and first_missed < latest_missed else None
        return TickPlan((latest_missed,), latest_missed, skipped)
    return TickPlan(tuple(on_time), on_time[-1] if on_time else latest_missed, first_missed)


def _check_common(name: str, task: str, catch_up: str) -> None:
    if not printable_text(name, _MAX_NAME):  # as task names: no control characters or lone surrogates
        raise ConfigurationError(f"schedule name {str(name)[:40]!r}: printable, 1-{_MAX_NAME} characters")
    if not task:
        raise ConfigurationError(f"schedule {name!r}: name the task it submits")
    if catch_up not in get_args(CatchUp):
        raise ConfigurationError(f"schedule {name!r}: catch_up={catch_up!r} must be one of {get_args(CatchUp)}")


def _zone(timezone: str, name: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"schedule {name!r}: unknown time zone {timezone!r}; use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from exc


def _cron_ticks(expression: str, zone: tzinfo, start: datetime, *, reverse: bool = False) -> Iterator[datetime]:
    """The ticks of ``expression`` in ``zone`` from ``start`` on (or back), as aware UTC.

    A job at a fixed time (neither its minute nor its hour field starts with ``*``) follows
    Debian cron through DST changes: its wall times are walked as the clock on the wall shows
    them, so a wall time the clocks skip runs once when the gap ends and one they repeat runs
    once, in its first pass. cronsim does that for five fields only; six (a leading seconds
    field) get the same rule here. Other jobs run at every real instant that matches, in both
    passes of a repeated hour.
    """
    fields = expression.split()
    minute, hour = fields[-5], fields[-4]
    if minute.startswith("*") or hour.startswith("*"):
        for found in CronSim(expression, start.astimezone(zone), reverse=reverse):
            yield found.astimezone(UTC)
        return
    for wall in CronSim(expression, start.astimezone(zone).replace(tzinfo=None), reverse=reverse):
        yield _on_the_wall(wall, zone)


def _on_the_wall(wall: datetime, zone: tzinfo) -> datetime:
    """When the clocks in ``zone`` show ``wall`` (its first pass, if they show it twice), or
    the first minute after a gap that skips it, as aware UTC."""
    while True:
        moment = wall.replace(tzinfo=zone).astimezone(UTC)
        if moment.astimezone(zone).replace(tzinfo=None) == wall:
            return moment
        wall += timedelta(minutes=1)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ConfigurationError(f"{moment!r} is a naive datetime; pass an aware one (e.g. datetime.now(UTC))")
    return moment.astimezone(UTC)
