"""Injected time, so policies and leases are tested without sleeping."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["Clock", "FrozenClock", "system_clock"]

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
