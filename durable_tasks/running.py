"""Running the loops, the App's side: one pass of the dispatcher, a worker, one pass of the
reaper, the queues' stats, and the connection check a process makes before it starts."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING

import tenacity
from anyio import to_thread

from .dispatcher import Dispatcher
from .errors import BrokerUnavailableError, DatabaseUnavailableError
from .outages import is_permanent
from .reaper import Reaper, ReapReport
from .stats import queue_stats
from .views import QueueStats
from .worker import Worker

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["RunningMixin"]

logger = logging.getLogger(__name__)


class RunningMixin:
    """check_connections, dispatch_once, work, reap_once, stats; mixed into :class:`~durable_tasks.App`."""

    runtime: Runtime

    def _database_errors(self) -> AbstractContextManager[None]:  # pragma: no cover - the App's
        raise NotImplementedError

    def _broker_errors(self) -> AbstractContextManager[None]:  # pragma: no cover - the App's
        raise NotImplementedError

    async def check_connections(self, *, wait: timedelta = timedelta(0)) -> None:
        """Raise DatabaseUnavailableError / BrokerUnavailableError if either cannot be reached.

        With ``wait``, keep trying for that long first (backing off up to 2 s, logging each
        failure): a process started during a Redis Cluster failover or before its servers are
        up then starts when they are, instead of exiting and waiting for its supervisor. What
        waiting cannot change (a database that does not exist, a refused password) is raised
        at once.
        """
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(
                lambda exc: isinstance(exc, DatabaseUnavailableError | BrokerUnavailableError) and not is_permanent(exc)
            ),
            stop=tenacity.stop_after_delay(wait.total_seconds()),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2),
            before_sleep=lambda state: logger.warning(
                "%s; retrying for up to %s", state.outcome.exception() if state.outcome else "?", wait
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._check_connections_once()

    async def _check_connections_once(self) -> None:
        with self._database_errors():
            await to_thread.run_sync(lambda: self.runtime.store.engine.connect().close())
        with self._broker_errors():
            await self.runtime.transport().client.ping()

    async def dispatch_once(self) -> int:
        """One dispatcher pass; returns how many outbox rows it handled (0 when none were due)."""
        return await Dispatcher(self.runtime).dispatch_once()

    async def work(
        self, max_tasks: int | None = None, timeout: timedelta | None = None, *, queues: list[str] | None = None
    ) -> int:
        """Run a worker until ``max_tasks`` deliveries are settled or ``timeout`` passes
        (a number of seconds is accepted too); returns how many it settled."""
        if isinstance(timeout, int | float):
            timeout = timedelta(seconds=timeout)
        return await Worker(self.runtime, queues=queues).run(max_tasks=max_tasks, timeout=timeout)

    async def reap_once(self) -> ReapReport:
        """One reaper pass (reclaim, dead-letter, reconcile, trim). The reconciler's walk goes
        on from where the previous call left it."""
        return await self._reaper.reap_once()

    @cached_property
    def _reaper(self) -> Reaper:
        return Reaper(self.runtime)

    async def stats(self) -> dict[str, QueueStats]:
        """Per queue: outbox backlog and oldest age, PEL size, queue delay, oldest pending age,
        stream lag, DLQ length."""
        with self._database_errors(), self._broker_errors():
            return await queue_stats(self.runtime)
