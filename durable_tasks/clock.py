"""Injected time, so policies and leases are tested without sleeping."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .errors import InvalidDelayError

__all__ = ["Clock", "FrozenClock", "due_time", "system_clock"]

#: A clock returns the current time as an aware UTC datetime.
Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The wall clock, UTC."""
    return datetime.now(UTC)


class FrozenClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or system_clock()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        """Move the clock forward by ``delta``."""
        self.now += delta


def due_time(now: datetime, *, delay: timedelta | None, not_before: datetime | None) -> datetime | None:
    """When a task submitted at ``now`` with ``delay`` or ``not_before`` is due (None: now).

    Raises :class:`~durable_tasks.errors.InvalidDelayError` for both at once, a negative
    delay or one past the year 9999, or a naive ``not_before``; a ``not_before`` in the past
    means now.
    """
    if delay is not None and not_before is not None:
        raise InvalidDelayError("give delay= or not_before=, not both")
    if delay is not None:
        if not isinstance(delay, timedelta) or delay < timedelta(0):
            raise InvalidDelayError(f"delay={delay!r} must be a timedelta of zero or more")
        try:
            return now + delay if delay else None
        except OverflowError:  # past datetime's year 9999
            raise InvalidDelayError(f"delay={delay} ends past the year 9999; pass years, not millennia") from None
    if not_before is not None:
        if not isinstance(not_before, datetime) or not_before.tzinfo is None or not_before.utcoffset() is None:
            raise InvalidDelayError(
                f"not_before={not_before!r} is a naive datetime; pass an aware one, "
                "e.g. datetime.now(UTC) + timedelta(hours=1)"
            )
        try:
            due = not_before.astimezone(UTC)
        except OverflowError:  # a moment of the year 9999 west of UTC is in the year 10000 in UTC
            raise InvalidDelayError(
                f"not_before={not_before} is past the year 9999 in UTC; pass an earlier one"
            ) from None
        return due if due > now else None
    return None
