"""How a dispatcher waits for work between passes: a store's notification wakes it at once
(PostgreSQL's LISTEN/NOTIFY); polling the outbox every ``poll_interval`` is the fallback."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import anyio

__all__ = ["OutboxWaiter", "PollingWaiter"]


class OutboxWaiter(Protocol):
    """Blocks until new outbox rows may be due, or the timeout passes."""

    async def listen(self) -> None:
        """Start listening now: a notification sent from here on ends the next wait. A caller
        listens before its first read of the outbox, or a row committed between that read
        and the first wait would go unseen until the poll."""
        ...

    async def wait(self, timeout: timedelta) -> None: ...

    async def aclose(self) -> None: ...


class PollingWaiter:
    """Sleeps the poll interval (a database without notifications)."""

    async def listen(self) -> None:
        """Nothing to listen to."""

    async def wait(self, timeout: timedelta) -> None:
        """Sleep for ``timeout``."""
        await anyio.sleep(timeout.total_seconds())

    async def aclose(self) -> None:
        """Nothing to release."""
