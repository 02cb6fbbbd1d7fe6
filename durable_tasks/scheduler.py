"""The scheduler loop: submit each periodic schedule's ticks as they come due.

Any number of schedulers may run (one per ``durable-tasks run`` process, or the
``scheduler`` role apart): for each schedule, a pass reads ``dt_schedules``, plans the due
ticks (:func:`durable_tasks.periodic.plan_ticks`) and, in ONE transaction, advances the
schedule's last tick by compare-and-set and submits the ticks. The scheduler whose
compare-and-set matches submits; the others match nothing and submit nothing, and the tick's
idempotency key would turn a second submit into the first one anyway.

Between passes the loop sleeps until the earliest next tick, and at most
``scheduler_refresh``, so that a schedule an operator resumed (or one another process
declared) is seen without a restart. A paused schedule is skipped; resuming it skips the
ticks that fell while it was paused (:func:`durable_tasks.store.schedules.set_paused`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from anyio import to_thread
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from .errors import DurableTasksError, UnknownScheduleError
from .periodic import Schedule, plan_ticks
from .store import schedules as store

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session as OrmSession

    from .clock import Clock
    from .runtime import Runtime
    from .settings import Settings
    from .tasks import TaskHandle

__all__ = ["ScheduleInfo", "Scheduler", "SchedulingApp", "list_schedules", "pause_schedule"]

logger = logging.getLogger(__name__)

#: Ticks one transaction submits at most (catch_up="all" after a long gap goes in chunks).
_TICKS_PER_TRANSACTION = 100
#: A wake-up that comes a hair early sleeps again at least this long (never a busy loop).
_MIN_SLEEP_S = 0.001


class SchedulingApp(Protocol):
    """What the scheduler uses of the :class:`~durable_tasks.App` whose schedules it ticks
    (a protocol, so that this module does not import the App that imports it)."""

    @property
    def settings(self) -> Settings:
        """The App's settings."""
        ...

    @property
    def runtime(self) -> Runtime:
        """The App's runtime (its store reads the schedules)."""
        ...

    @property
    def engine(self) -> sa.Engine:
        """The engine the ticks are submitted on."""
        ...

    @property
    def clock(self) -> Clock:
        """The App's clock."""
        ...

    def submit(self, session: OrmSession, task: Any, payload: Any, *, idempotency_key: str | None = None) -> TaskHandle:
        """Record a task intent in ``session``'s transaction."""
        ...


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as listings show it: what the code declared and what the database says."""

    name: str
    task: str
    spec: str
    catch_up: str
    paused: bool
    last_tick: datetime | None
    next_tick: datetime | None
    #: False for a row no code of this App declares any more (it is never ticked).
    declared: bool


class Scheduler:
    """Submits the due ticks of an App's schedules; see the module docstring."""

    def __init__(self, app: SchedulingApp, schedules: Mapping[str, Schedule]) -> None:
        self.app = app
        self.schedules = schedules
        self._declared = False
        #: Submit calls made, and how many of them created a task (the rest found the tick's
        #: task already there): a scheduler that lost no race has both equal.
        self.submitted = 0
        self.created = 0

    async def tick_once(self) -> int:
        """One pass over every schedule; returns how many ticks it submitted."""
        submitted, _ = await to_thread.run_sync(self._pass)
        return submitted

    async def run(self) -> None:
        """Tick until cancelled, sleeping until the earliest next tick (a pass that fails, the
        database away, is retried after ``scheduler_refresh``)."""
        refresh = self.app.settings.scheduler_refresh
        while True:
            try:
                _, wake = await to_thread.run_sync(self._pass)
            except SQLAlchemyError as exc:
                logger.warning("scheduler pass failed (%s); retrying in %s", type(exc).__name__, refresh)
                wake = None
            now = self.app.clock()
            until = now + refresh if wake is None else min(wake, now + refresh)
            await anyio.sleep(max(_MIN_SLEEP_S, (until - now).total_seconds()))

    # -- one pass (in a worker thread) ----------------------------------------------------

    def _pass(self) -> tuple[int, datetime | None]:
        app, ns = self.app, self.app.settings.namespace
        if not self.schedules:
            return 0, None
        if not self._declared:
            store.declare(app.engine, ns, [_declared(sch, app.clock()) for sch in self.schedules.values()], app.clock())
            self._declared = True
        states = store.load(app.runtime.store.read_engine, ns)
        submitted, wake = 0, None
        for name, schedule in self.schedules.items():
            state = states.get(name)
            if state is None:  # a row deleted by hand: declared again on the next pass
                self._declared = False
                continue
            if state.paused:
                continue
            submitted += self._tick(schedule, state)
            following = schedule.next_tick(max(state.last_tick_at, app.clock()))
            if following is not None and (wake is None or following < wake):
                wake = following
        return submitted, wake

    def _tick(self, schedule: Schedule, state: store.ScheduleState) -> int:
        """Submit what is due for one schedule; returns the ticks submitted."""
        app, s = self.app, self.app.settings
        submitted = 0
        while True:
            now = app.clock()
            plan = plan_ticks(
                schedule, last_tick=state.last_tick_at, now=now, grace=s.scheduler_grace, limit=_TICKS_PER_TRANSACTION
            )
            if not plan.moves:
                return submitted
            with Session(app.engine) as session:
                moved = store.advance(
                    session.connection(),
                    s.namespace,
                    schedule.name,
                    seen=state,
                    last_tick=plan.last_tick,
                    next_tick=schedule.next_tick(max(plan.last_tick, now)),
                    now=now,
                )
                if not moved:  # another scheduler (or an operator) got there first
                    return submitted
                try:
                    handles = [
                        app.submit(
                            session,
                            schedule.task,
                            schedule.payload_for(tick),
                            idempotency_key=schedule.idempotency_key(tick),
                        )
                        for tick in plan.submit
                    ]
                except DurableTasksError:
                    logger.exception(
                        "schedule %s: submitting %s failed; the ticks stay due", schedule.name, plan.submit
                    )
                    return submitted
                session.commit()
            self.submitted += len(handles)
            self.created += sum(h.created for h in handles)
            if plan.skipped_from is not None:
                logger.warning(
                    "schedule %s: skipped missed ticks from %s (catch_up=%s)",
                    schedule.name,
                    plan.skipped_from.isoformat(),
                    schedule.catch_up,
                )
            submitted += len(plan.submit)
            state = replace(state, last_tick_at=plan.last_tick)


def _declared(schedule: Schedule, now: datetime) -> store.DeclaredSchedule:
    return store.DeclaredSchedule(
        schedule.name, schedule.task, schedule.spec, schedule.catch_up, schedule.next_tick(now.replace(microsecond=0))
    )


def list_schedules(app: SchedulingApp, schedules: Mapping[str, Schedule]) -> list[ScheduleInfo]:
    """Every schedule of the App's namespace with its next tick: the declared ones (a row or
    not yet) and rows that no code declares any more."""
    now = app.clock()
    rows = store.load(app.runtime.store.read_engine, app.settings.namespace)
    found: list[ScheduleInfo] = []
    for name in sorted(set(rows) | set(schedules)):
        row, schedule = rows.get(name), schedules.get(name)
        next_tick = None
        if schedule is not None and not (row is not None and row.paused):
            next_tick = schedule.next_tick(max(now, row.last_tick_at) if row is not None else now)
        found.append(
            ScheduleInfo(
                name=name,
                task=schedule.task if schedule is not None else row.task_name if row is not None else "",
                spec=schedule.spec if schedule is not None else row.spec if row is not None else "",
                catch_up=schedule.catch_up if schedule is not None else row.catch_up if row is not None else "",
                paused=row is not None and row.paused,
                last_tick=None if row is None else row.last_tick_at,
                next_tick=next_tick,
                declared=schedule is not None,
            )
        )
    return found


def pause_schedule(app: SchedulingApp, schedules: Mapping[str, Schedule], name: str, *, paused: bool) -> None:
    """Pause (or resume) a schedule in the database: every scheduler sees it on its next pass;
    no deploy or restart is needed."""
    schedule = schedules.get(name)
    now = app.clock()
    if schedule is not None:
        store.declare(app.engine, app.settings.namespace, [_declared(schedule, now)], now)
    next_tick = None if paused or schedule is None else schedule.next_tick(now)
    if not store.set_paused(app.engine, app.settings.namespace, name, paused=paused, now=now, next_tick=next_tick):
        raise UnknownScheduleError(f"no schedule named {name!r}; see `durable-tasks schedules list`")
