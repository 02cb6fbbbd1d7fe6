"""The reaper's operations on the store (reclaim, defer, dead-letter, reconcile, backlog), shared
by every dialect: a mixin of :class:`~.base.SqlStore` that runs :mod:`.recovery`'s statements in
its transactions with the dialect's dispatcher wake-up."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import sqlalchemy as sa

from ..policy import TaskLeaseView
from . import deferral, queries, recovery
from .deferral import Deferral
from .queries import QueueBacklog
from .recovery import DeadTask, ReconcileCursor, UnconfirmedPage

__all__ = ["RecoveryStore"]

R = TypeVar("R")


class RecoveryStore:
    """The reaper's operations; the concrete store supplies the engines and the hooks."""

    _engine: sa.Engine
    _read_engine: sa.Engine

    if TYPE_CHECKING:  # the concrete store's (defined there, not stubbed here: the MRO would pick a stub)

        @property
        def runtime_engine(self) -> sa.Engine: ...

        async def _in_thread(self, call: Callable[[], R]) -> R: ...

        def _runtime_read(self, action: Callable[..., R], *args: object, **kwargs: object) -> R: ...

        def _wake_dispatchers(self, conn: sa.Connection, namespace: str) -> None: ...

        def _settle_if_child(
            self, conn: sa.Connection, namespace: str, task_id: str, state: str, now: datetime
        ) -> None: ...

        def _lock_with_parent_of(self, conn: sa.Connection, task_id: str) -> bool: ...

    async def lease_views(self, namespace: str, task_ids: Iterable[str]) -> dict[str, TaskLeaseView]:
        """What the database says about each task."""
        ids = list(task_ids)
        return await self._in_thread(partial(self._runtime_read, recovery.lease_views, namespace, ids))

    async def redeliver(
        self,
        namespace: str,
        *,
        task_id: str,
        generation: int,
        delivery: int,
        now: datetime,
        reason: str,
        count_reclaim: bool,
        due: datetime | None = None,
    ) -> bool:
        """Supersede a delivery with a new one (on the application's engine, as failures are)."""

        def run() -> bool:
            with self._engine.begin() as conn:
                done = recovery.redeliver(
                    conn,
                    namespace,
                    task_id=task_id,
                    generation=generation,
                    delivery=delivery,
                    now=now,
                    reason=reason,
                    count_reclaim=count_reclaim,
                    due=due,
                )
                if done:
                    self._wake_dispatchers(conn, namespace)
            return done

        return await self._in_thread(run)

    async def redeliver_lost(
        self,
        namespace: str,
        lost: Sequence[tuple[str, int, int]],
        *,
        now: datetime,
        reason: str,
        count_reclaim: bool = True,
    ) -> list[bool]:
        """Supersede lost deliveries in one transaction of a few statements
        (:func:`.recovery.redeliver_many`): a worker killed holding thousands of tasks is
        redelivered a page at a time, not a commit (nor four statements) per task."""

        def run() -> list[bool]:
            with self.runtime_engine.begin() as conn:  # no application code runs here
                done = self._redeliver_lost(conn, namespace, lost, now=now, reason=reason, count_reclaim=count_reclaim)
                if any(done):
                    self._wake_dispatchers(conn, namespace)
            return done

        return await self._in_thread(run)

    def _redeliver_lost(
        self,
        conn: sa.Connection,
        namespace: str,
        lost: Sequence[tuple[str, int, int]],
        *,
        now: datetime,
        reason: str,
        count_reclaim: bool,
    ) -> list[bool]:
        """:func:`.recovery.redeliver_many` in ``conn``'s transaction (a dialect may send it as one
        statement)."""
        return recovery.redeliver_many(conn, namespace, lost, now=now, reason=reason, count_reclaim=count_reclaim)

    async def defer_deliveries(self, namespace: str, rows: Sequence[Deferral], *, now: datetime) -> int:
        """Supersede deliveries refused admission with new ones due later (:mod:`.deferral`)."""

        def run() -> int:
            with self._engine.begin() as conn:
                moved = deferral.defer_deliveries(conn, namespace, rows, now)
                if moved:
                    self._wake_dispatchers(conn, namespace)
                return moved

        return await self._in_thread(run)

    async def dead_letter_task(
        self,
        namespace: str,
        *,
        task_id: str,
        generation: int,
        delivery: int,
        now: datetime,
        reason: str,
        on_dead: Callable[[sa.Connection, DeadTask], None] | None = None,
    ) -> bool:
        """Mark the task DEAD, running its failure hooks in the same transaction."""

        def run() -> bool:
            with self._engine.begin() as conn:
                child = self._lock_with_parent_of(conn, task_id)
                dead = recovery.dead_letter_task(
                    conn,
                    namespace,
                    task_id=task_id,
                    generation=generation,
                    delivery=delivery,
                    now=now,
                    reason=reason,
                    on_dead=on_dead,
                )
                if dead and child:
                    self._settle_if_child(conn, namespace, task_id, "DEAD", now)
                return dead

        return await self._in_thread(run)

    async def unconfirmed_deliveries(
        self,
        namespace: str,
        *,
        now: datetime,
        grace: timedelta,
        limit: int,
        after: ReconcileCursor | None = None,
    ) -> UnconfirmedPage:
        """A page of the sent deliveries whose entry the reconciler checks."""
        read = partial(recovery.unconfirmed_deliveries, now=now, grace=grace, limit=limit, after=after)
        return await self._in_thread(partial(self._runtime_read, read, namespace))

    async def queue_backlogs(self, namespace: str) -> dict[str, QueueBacklog]:
        """Per queue backlog."""

        def read() -> dict[str, QueueBacklog]:
            with self._read_engine.connect() as conn:
                return queries.queue_backlogs(conn, namespace)

        return await self._in_thread(read)
