"""One value per event loop: the runtime's connections that belong to the loop that made them.

Async clients (redis.asyncio, psycopg's AsyncConnection) are bound to the event loop they were
created on. A process normally runs one loop for its whole life, but tests, scripts and the CLI
may run several one after another (``anyio.run`` twice); each loop must get its own clients,
and the clients of a loop that is gone must be closed rather than leaked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["LoopBound"]

T = TypeVar("T")


class LoopBound(Generic[T]):
    """The value ``make()`` returns for the running event loop, made on first use in it.

    When another loop asks, the previous loop's value is closed with ``close_stale`` (it cannot
    be awaited from this loop: the close must not wait on the old loop) and a new value is
    made. The loop object is kept, not its id: a new loop may reuse a dead one's id.
    """

    def __init__(
        self,
        make: Callable[[], T],
        *,
        close_stale: Callable[[T], None],
        aclose: Callable[[T], Awaitable[None]],
    ) -> None:
        self._make = make
        self._close_stale = close_stale
        self._aclose = aclose
        self._held: tuple[asyncio.AbstractEventLoop, T] | None = None

    def get(self) -> T:
        """The running loop's value (made now if this loop has none yet)."""
        loop = asyncio.get_running_loop()
        held = self._held
        if held is not None and held[0] is loop:
            return held[1]
        value = self._make()
        self._held = (loop, value)
        if held is not None:
            self._close_stale(held[1])
        return value

    @property
    def current(self) -> T | None:
        """The value made last (on whichever loop), or None."""
        return None if self._held is None else self._held[1]

    async def aclose(self) -> None:
        """Close the value: awaited on its own loop, closed at once from any other."""
        held, self._held = self._held, None
        if held is None:
            return
        loop, value = held
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            await self._aclose(value)
        else:
            self._close_stale(value)

    def close(self) -> None:
        """Close the value without waiting on any loop (from sync code)."""
        held, self._held = self._held, None
        if held is not None:
            self._close_stale(held[1])
