"""The App: the user's face of the runtime. It registers tasks, records intents in the
caller's transaction, reads tasks back, and runs the loops on the :class:`~.runtime.Runtime`
it assembles (settings, clock, telemetry, registry, store, transport)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from types import MappingProxyType
from typing import Any, TypeVar, Unpack

import anyio
import sqlalchemy as sa
from anyio import to_thread
from sqlmodel import SQLModel

from . import migrations
from .clock import Clock, system_clock
from .dispatcher import Dispatcher
from .embedded import default_data_dir
from .errors import ConfigurationError, InvalidFlowControlError, TaskNotFoundError
from .flow.control import LimitInfo, clear_limit, declared_limits, read_limits, write_limit
from .flow.policy import Limit, parse_rate, task_flow
from .intents import IntentsMixin
from .outages import broker_errors, database_errors
from .periodic import TICK, CatchUp, Schedule
from .reaper import Reaper
from .result_waits import ResultWaits
from .running import RunningMixin
from .runtime import Runtime
from .scheduler import ScheduleInfo, Scheduler, list_schedules, pause_schedule
from .settings import NAME_PATTERN, Settings, SettingsOverrides, printable_text
from .signals import SignalsMixin
from .store import open_store
from .store.ids import is_task_id_shaped
from .store.retention import PruneReport
from .tasks import Task, TaskContext, TaskDecorator
from .telemetry import Redactor, Telemetry
from .views import TaskInfo
from .worker import Worker

__all__ = ["App"]

P = TypeVar("P")
R = TypeVar("R")

_MAX_TASK_NAME = 200  # dt_tasks.name


class App(IntentsMixin, RunningMixin, SignalsMixin):
    """One durable task runtime: the registry of tasks, the settings, the database and Redis.

    ``App()`` with no URLs uses a SQLite file and an embedded Valkey in ``data_dir`` (by default
    ``.durable_tasks`` beside the module that builds the App; a relative setting is read from
    the working directory when the App is built); every
    setting can be passed as a keyword argument (``App(url, lease_timeout=timedelta(seconds=30))``)
    or come from its ``DT_*`` environment variable.
    """

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        namespace: str | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock = system_clock,
        redact: Redactor | None = None,
        tables: Sequence[type[SQLModel]] = (),
        **overrides: Unpack[SettingsOverrides],
    ) -> None:
        given = {"database_url": database_url, "redis_url": redis_url, "namespace": namespace, **overrides}
        try:
            base = settings or Settings()
            self.settings = Settings.model_validate(
                base.model_dump() | {k: v for k, v in given.items() if v is not None}
            )
        except ValueError as exc:
            raise ConfigurationError(f"invalid durable_tasks settings: {exc}") from exc
        # Resolved once, absolute: every later use (SQLite file, Valkey) is the same place.
        explicit = given.get("data_dir") is not None or "data_dir" in base.model_fields_set
        self.settings.data_dir = self.settings.data_dir.resolve() if explicit else default_data_dir()
        #: The application's tables: create_all makes them beside the runtime's.
        self.tables: list[type[SQLModel]] = list(tables)
        self._registry: dict[str, Task[Any, Any]] = {}
        #: Shared limits by name (:meth:`limit`).
        self.limits: dict[str, Limit] = {}
        self._redis_url: str | None = self.settings.redis_url
        s = self.settings
        #: What the dispatcher, workers and reaper of this App run on.
        self.runtime = Runtime(
            s,
            clock=clock,
            telemetry=Telemetry(s.namespace, trace_payloads=s.trace_payloads, redact=redact),
            registry=MappingProxyType(self._registry),
            open_store=lambda: open_store(s),
            redis_url=lambda: self.redis_url,
        )
        #: Periodic schedules by name (``@app.periodic``).
        self.schedules: dict[str, Schedule] = {}
        #: Result waits of this App (``handle.result()``, ``await handle.wait()``).
        self.results = ResultWaits(self.runtime, redis_url=lambda: self.redis_url)

    @property
    def clock(self) -> Clock:
        """The clock every timestamp and lease of this App is read from."""
        return self.runtime.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.runtime.clock = clock

    # -- declaring tasks -----------------------------------------------------------------

    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: timedelta | None = None,
        retry_on: tuple[type[BaseException], ...] = (),
        priority: int | None = None,
        rate_limit: str | Limit | None = None,
        concurrency_limit: int | Limit | None = None,
    ) -> TaskDecorator:
        """Register ``fn(ctx, payload) -> R`` (sync or async) as a ``Task[payload, R]``.

        ``max_attempts`` counts executions that raise; ``retry_on`` limits which exceptions
        retry (default: all); ``timeout`` bounds one attempt. Flow control
        (docs/flow-control.md): ``priority`` (0-3) is the default level and gives the queue
        levels; ``rate_limit`` (``"600/m"`` or an :meth:`limit`) and ``concurrency_limit``
        (running attempts per ``concurrency_key``, or an :meth:`limit`) hold across workers.
        """

        def register(f: Callable[[TaskContext[Any], Any], Any]) -> Task[Any, Any]:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if not NAME_PATTERN.fullmatch(queue):
                raise ConfigurationError(f"queue name {queue!r} must match {NAME_PATTERN.pattern}")
            if not printable_text(task_name, _MAX_TASK_NAME):
                raise ConfigurationError(f"task name {task_name[:40]!r}: printable, 1-{_MAX_TASK_NAME} characters")
            if task_name in self._registry:
                raise ConfigurationError(
                    f"a task named {task_name!r} is already registered; pass name=... to register this one apart"
                )
            if max_attempts < 1:
                raise ConfigurationError("max_attempts must be at least 1")
            for limit in (rate_limit, concurrency_limit):
                if isinstance(limit, Limit) and self.limits.get(limit.name) is not limit:
                    raise ConfigurationError(f"limit {limit.name!r} is not this App's: make it with app.limit(...)")
            t: Task[Any, Any] = Task(
                f,
                submit=self.submit,
                submit_many=self.submit_many,
                name=task_name,
                queue=queue,
                max_attempts=max_attempts,
                timeout=timeout,
                retry_on=retry_on,
                flow=task_flow(
                    task_name, priority=priority, rate_limit=rate_limit, concurrency_limit=concurrency_limit
                ),
            )
            self._registry[task_name] = t
            return t

        return register

    def limit(
        self, name: str, *, rate: str | None = None, burst: int | None = None, concurrency: int | None = None
    ) -> Limit:
        """A limit several tasks share: ``rate="3000/m"`` (``burst`` admissions at once,
        default 1) and/or ``concurrency`` (running attempts per concurrency key). Pass it as a
        task's ``rate_limit=`` or ``concurrency_limit=``. Its rate and burst can be changed
        while workers run (docs/flow-control.md)."""
        if name in self.limits:
            raise ConfigurationError(f"a limit named {name!r} exists already; use that one")
        made = Limit(name, rate=None if rate is None else parse_rate(rate), burst=burst or 1, concurrency=concurrency)
        self.limits[name] = made
        return made

    def _limit(self, name: str) -> Limit:
        found = declared_limits(self._registry, self.limits).get(name)
        if found is None:
            raise InvalidFlowControlError(f"no limit named {name!r}; declared: {sorted(self.limits)}")
        return found

    async def limits_status(self) -> list[LimitInfo]:
        """Every limit as admission applies it now (``status`` shows them)."""
        with self._broker_errors():
            limits = declared_limits(self._registry, self.limits).values()
            return await read_limits(self.runtime.transport(), self.settings.namespace, limits)

    async def set_limit(
        self, name: str, *, rate: str | None = None, burst: int | None = None, concurrency: int | None = None
    ) -> None:
        """Change a limit on every worker now, no deploy: the values given override the
        code's until :meth:`clear_limit` (a task's own limit is named ``task:<name>``)."""
        limit = self._limit(name)
        with self._broker_errors():
            transport, namespace = self.runtime.transport(), self.settings.namespace
            await write_limit(transport, namespace, limit, rate=rate, burst=burst, concurrency=concurrency)

    async def clear_limit(self, name: str) -> bool:
        """Back to the code's values for ``name``; False if nothing was set at run time."""
        self._limit(name)
        with self._broker_errors():
            return await clear_limit(self.runtime.transport(), self.settings.namespace, name)

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: timedelta | None = None,
        name: str | None = None,
        timezone: str = "UTC",
        catch_up: CatchUp = "latest",
        payload: Any = TICK,
    ) -> Callable[[Task[P, R]], Task[P, R]]:
        """Submit a task on a schedule: a cron expression (five fields, or six with seconds
        first) read in ``timezone``, or ``every`` (whole seconds, counted from the epoch in UTC).

        Put it above ``@app.task``. The payload is the tick's time (aware UTC) unless
        ``payload`` gives one; ``catch_up`` says what happens to ticks missed while no scheduler
        ran (docs/scheduling.md). ``name`` defaults to the task's name.
        """

        def register(task: Task[P, R]) -> Task[P, R]:
            schedule_name = name or task.name
            if (cron is None) == (every is None):
                raise ConfigurationError(f"schedule {schedule_name!r}: give a cron expression or every=, not both")
            if schedule_name in self.schedules:
                raise ConfigurationError(f"a schedule named {schedule_name!r} exists; pass name=... to add another")
            if every is not None:
                schedule = Schedule.interval(schedule_name, task.name, every, catch_up=catch_up, payload=payload)
            else:
                assert cron is not None
                schedule = Schedule.cron_schedule(
                    schedule_name, task.name, cron, timezone=timezone, catch_up=catch_up, payload=payload
                )
            self._checked_item(task, 0, (schedule.payload_for(system_clock()), None))  # its payload fits the task
            self.schedules[schedule_name] = schedule
            return task

        return register

    def list_schedules(self) -> list[ScheduleInfo]:
        """Every schedule with its last and next tick (and rows no code declares any more)."""
        with self._database_errors():
            return list_schedules(self, self.schedules)

    def pause_schedule(self, name: str) -> None:
        """Pause a schedule in the database: every scheduler stops submitting its ticks."""
        with self._database_errors():
            pause_schedule(self, self.schedules, name, paused=True)

    def resume_schedule(self, name: str) -> None:
        """Resume a paused schedule; the ticks that fell while it was paused are skipped."""
        with self._database_errors():
            pause_schedule(self, self.schedules, name, paused=False)

    @property
    def registry(self) -> Mapping[str, Task[Any, Any]]:
        """The registered tasks by name (read-only)."""
        return self.runtime.registry

    # -- database ------------------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (created on first use): open your Sessions on it to submit."""
        return self.runtime.store.engine

    def create_all(self) -> None:
        """Migrate the runtime's tables to the latest version (creating them in an empty
        database; :mod:`durable_tasks.migrations`) and create the application's ``tables`` if
        they do not exist. ``durable-tasks init-db`` calls this.

        Only the tables named in ``App(tables=[...])`` are made, never every model SQLModel
        knows of: an application's own tables usually belong to its migrations."""
        tables: list[sa.Table] = [model.__table__ for model in self.tables]  # type: ignore[attr-defined]
        with self._database_errors():
            migrations.migrate(self.engine)
            if tables:
                self.runtime.store.create_all(tables)

    def check_schema(self) -> migrations.SchemaStatus:
        """Raise a :class:`~durable_tasks.errors.SchemaError` naming the command that fixes it
        if this code cannot run on the database's schema (missing, older than it needs, or
        contracted by a newer release); a newer schema it can run on is logged as a warning."""
        with self._database_errors():
            return migrations.check_schema(self.engine)

    def _database_errors(self) -> AbstractContextManager[None]:
        return database_errors(lambda: self.engine)

    def _broker_errors(self) -> AbstractContextManager[None]:
        return broker_errors(lambda: self.redis_url)

    # -- reading and pruning tasks -------------------------------------------------------

    def get_task(self, task_id: str) -> TaskInfo:
        """The task's state, generation, attempt, result, error and attempts history."""
        with self._database_errors():
            loaded = (
                self.runtime.store.load_task(self.settings.namespace, task_id) if is_task_id_shaped(task_id) else None
            )
        if loaded is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self.settings.namespace!r}")
        return TaskInfo.from_records(*loaded)

    def prune(
        self, older_than: timedelta, *, batch: int = 1000, max_batches: int = 1000, paced: bool = True
    ) -> PruneReport:
        """Delete sent outbox rows and final tasks (with attempts) older than ``older_than``,
        ``batch`` rows per transaction. Pending work is never touched. A prune pauses after each
        batch so that running workers keep most of the database (SQLite's write lock, the
        server's CPU), but never below ``retention_min_rate`` tasks a second; ``paced=False``
        drops the pauses (about 4x faster when no worker runs)."""
        before = self.clock() - older_than
        with self._database_errors():
            return self.runtime.store.prune(
                self.settings.namespace,
                before=before,
                batch=batch,
                max_batches=max_batches,
                paced=paced,
                min_rate=self.settings.retention_min_rate,
            )

    # -- Redis ---------------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        """The Redis URL in use (starting the embedded Valkey if none was given)."""
        if self._redis_url is None:
            from .embedded import ensure_valkey

            self._redis_url = ensure_valkey(self.settings.data_dir)
        return self._redis_url

    def stop_embedded(self) -> bool:
        """Stop using the embedded Valkey now, and stop it if no other process uses it; True if
        it was stopped (no-op with a configured Redis URL). Not needed at exit: the server stops
        by itself once the last process that uses it has exited."""
        if self.settings.redis_url is not None:
            return False
        from .embedded import stop_valkey

        return stop_valkey(self.settings.data_dir)

    async def aclose(self) -> None:
        """Close the Redis client of this event loop, the loops' database connections, the
        engine's pool, and this process's result-wait subscription."""
        self.results.close()
        await self.runtime.aclose()

    # -- running -------------------------------------------------------------------------

    async def run(
        self,
        *,
        dispatcher: bool = True,
        worker: bool = True,
        reaper: bool = True,
        scheduler: bool = True,
        queues: list[str] | None = None,
        stop: anyio.Event | None = None,
    ) -> None:
        """Run the chosen components until ``stop`` is set (or cancellation); the scheduler
        runs only when the App has schedules.

        On ``stop`` the worker stops reading and gives in-flight tasks ``shutdown_grace`` to
        finish (whatever is left stays pending for a reaper); then the dispatcher and reaper end.
        """
        await self.check_connections(wait=self.settings.startup_wait)
        await to_thread.run_sync(self.check_schema)
        w = Worker(self.runtime, queues=queues) if worker else None
        async with anyio.create_task_group() as tg:
            if dispatcher:
                tg.start_soon(Dispatcher(self.runtime).run)
            if reaper:
                tg.start_soon(Reaper(self.runtime).run)
            if scheduler and self.schedules:
                tg.start_soon(Scheduler(self, self.schedules).run)
            if w is not None:

                async def work_then_stop_all() -> None:
                    await w.run()
                    tg.cancel_scope.cancel()

                tg.start_soon(work_then_stop_all)
            if stop is not None:
                await stop.wait()
                if w is not None:
                    w.stop()
                else:
                    tg.cancel_scope.cancel()
