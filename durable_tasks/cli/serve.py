"""The runtime's processes: ``init-db``, ``run``, ``worker``, ``dispatcher``, ``reaper``.

Each checks its connections and the schema first (one line and exit 2 when one fails), prints
a banner of what it runs against what, then runs until SIGINT or SIGTERM. ``run`` and
``worker`` take what a deployer sets per process (queues, concurrency, handler threads, shutdown
grace) as options, overriding the App's settings for this process only.
"""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from typing import Annotated, Any

import anyio
import anyio.abc
import typer

from ..app import App
from ..errors import ConfigurationError, DurableTasksError
from ..process import tune_gc
from ..settings import Settings
from .banner import banner
from .base import AppArg, AppOpt, app_spec, check, cli, console, fail, load_app

__all__ = ["serve"]

QueuesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--queues", "-Q", help="Read only these queues (comma-separated or repeated; default: every registered one)"
    ),
]
ConcurrencyOpt = Annotated[
    int | None, typer.Option("--concurrency", "-c", help="Tasks run at once (default: DT_CONCURRENCY, 1000)")
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="Threads sync handlers run on, at most (default: DT_HANDLER_THREADS, one per slot; 512 suits "
        "handlers that block briefly)"
    ),
]
GraceOpt = Annotated[
    float | None,
    typer.Option(help="Seconds in-flight tasks get to finish after SIGTERM (default: DT_SHUTDOWN_GRACE, 30)"),
]
WaitOpt = Annotated[
    float | None,
    typer.Option(help="Seconds to keep retrying unreachable servers at start (default: DT_STARTUP_WAIT, 30)"),
]
LogOpt = Annotated[str, typer.Option(help="Log level: DEBUG, INFO, WARNING, ERROR")]


async def _serve(app: App, roles: list[str], queues: list[str] | None) -> None:
    stop = anyio.Event()

    async def on_signal(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for signum in signals:
                console().print(f"[yellow]{signal.Signals(signum).name}: stopping gracefully[/]")
                stop.set()
                return

    try:
        # Outside the task group: a typed error, not a group.
        await app.check_connections(wait=app.settings.startup_wait)
        await anyio.to_thread.run_sync(app.check_schema)
        async with anyio.create_task_group() as tg:
            await tg.start(on_signal)  # a signal after the banner stops gracefully
            for line in banner(app, roles, queues=queues):
                console().print(line, highlight=False, soft_wrap=True)
            await app.run(
                dispatcher="dispatcher" in roles,
                worker="worker" in roles,
                reaper="reaper" in roles,
                scheduler="scheduler" in roles,
                queues=queues,
                stop=stop,
            )
            tg.cancel_scope.cancel()
    finally:
        await app.aclose()


def serve(app: App, roles: list[str], *, queues: list[str] | None = None, log_level: str = "INFO") -> None:
    """Run the chosen components (``roles``) in this process until SIGINT/SIGTERM; typed
    errors exit 2."""
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise fail(ConfigurationError(f"--log-level {log_level!r}: use DEBUG, INFO, WARNING or ERROR"))
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_gc(app.settings)  # this process is the runtime's own
    try:
        anyio.run(lambda: _serve(app, roles, queues))
    except DurableTasksError as exc:
        raise fail(exc) from exc


def _queues(given: list[str] | None, app: App) -> list[str] | None:
    names = [q.strip() for value in given or [] for q in value.split(",") if q.strip()]
    unknown = sorted(set(names) - set(app.runtime.queues()))
    if unknown:
        known = ", ".join(app.runtime.queues()) or "none"
        raise fail(ConfigurationError(f"no registered task uses queue {', '.join(unknown)} (queues: {known})"))
    return names or None


def _per_process(
    app: App, concurrency: int | None, handler_threads: int | None, grace: float | None, wait: float | None
) -> None:
    """The options ``run`` and ``worker`` share, over the App's settings (None: as set)."""
    _override(app, concurrency=concurrency, handler_threads=handler_threads, shutdown_grace=grace, startup_wait=wait)


def _override(app: App, **values: Any) -> None:
    """Set the given settings on this process's App, validated as DT_* values would be."""
    given = {key: value for key, value in values.items() if value is not None}
    for key in ("shutdown_grace", "startup_wait"):
        if key in given:
            given[key] = timedelta(seconds=given[key])
    if not given:
        return
    try:
        checked = Settings.model_validate(app.settings.model_dump() | given)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise fail(ConfigurationError(f"invalid option: {' '.join(first[:3])}")) from exc
    for key in given:  # the runtime reads the same object
        setattr(app.settings, key, getattr(checked, key))


@cli.command("init-db")
def init_db(app: AppArg = None, app_option: AppOpt = None) -> None:
    """Create the runtime's tables, or migrate them to the latest version (and create the
    App's own ``tables``)."""
    the_app = load_app(app_spec(app, app_option))
    check(the_app, redis=False)
    try:
        the_app.create_all()
    except DurableTasksError as exc:
        raise fail(exc) from exc
    console().print("tables ready")


@cli.command()
def run(
    app: AppArg = None,
    app_option: AppOpt = None,
    queues: QueuesOpt = None,
    concurrency: ConcurrencyOpt = None,
    handler_threads: ThreadsOpt = None,
    shutdown_grace: GraceOpt = None,
    startup_wait: WaitOpt = None,
    dispatcher: Annotated[bool, typer.Option(help="Run a dispatcher")] = True,
    reaper: Annotated[bool, typer.Option(help="Run a reaper")] = True,
    scheduler: Annotated[bool, typer.Option(help="Run a scheduler (when the App has schedules)")] = True,
    log_level: LogOpt = "INFO",
) -> None:
    """Run dispatcher, worker, reaper and (when the App has schedules) a scheduler in one
    process (Ctrl-C stops gracefully)."""
    the_app = load_app(app_spec(app, app_option))
    _per_process(the_app, concurrency, handler_threads, shutdown_grace, startup_wait)
    wanted = {"dispatcher": dispatcher, "worker": True, "reaper": reaper, "scheduler": scheduler}
    roles = [role for role, on in wanted.items() if on and (role != "scheduler" or the_app.schedules)]
    serve(the_app, roles, queues=_queues(queues, the_app), log_level=log_level)


@cli.command()
def worker(
    app: AppArg = None,
    app_option: AppOpt = None,
    queues: QueuesOpt = None,
    concurrency: ConcurrencyOpt = None,
    handler_threads: ThreadsOpt = None,
    shutdown_grace: GraceOpt = None,
    startup_wait: WaitOpt = None,
    log_level: LogOpt = "INFO",
) -> None:
    """Run a worker only."""
    the_app = load_app(app_spec(app, app_option))
    _per_process(the_app, concurrency, handler_threads, shutdown_grace, startup_wait)
    serve(the_app, ["worker"], queues=_queues(queues, the_app), log_level=log_level)


@cli.command()
def dispatcher(
    app: AppArg = None, app_option: AppOpt = None, startup_wait: WaitOpt = None, log_level: LogOpt = "INFO"
) -> None:
    """Run a dispatcher only."""
    the_app = load_app(app_spec(app, app_option))
    _override(the_app, startup_wait=startup_wait)
    serve(the_app, ["dispatcher"], log_level=log_level)


@cli.command()
def reaper(
    app: AppArg = None, app_option: AppOpt = None, startup_wait: WaitOpt = None, log_level: LogOpt = "INFO"
) -> None:
    """Run a reaper (and reconciler) only."""
    the_app = load_app(app_spec(app, app_option))
    _override(the_app, startup_wait=startup_wait)
    serve(the_app, ["reaper"], log_level=log_level)
