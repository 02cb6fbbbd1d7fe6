"""The runtime's processes: ``init-db``, ``run``, ``worker``, ``dispatcher``, ``reaper``."""

from __future__ import annotations

import logging
import signal

import anyio

from ..app import App
from ..errors import DurableTasksError
from ..process import tune_gc
from .base import AppArg, check, cli, console, fail, load_app

__all__ = ["serve"]


async def _serve(
    app: App, *, dispatcher: bool, worker: bool, reaper: bool, scheduler: bool, queues: list[str] | None
) -> None:
    stop = anyio.Event()

    async def on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                console().print(f"[yellow]{signal.Signals(signum).name}: stopping gracefully[/]")
                stop.set()
                return

    try:
        # Outside the task group: a typed error, not a group.
        await app.check_connections(wait=app.settings.startup_wait)
        await anyio.to_thread.run_sync(app.check_schema)
        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal)
            await app.run(
                dispatcher=dispatcher, worker=worker, reaper=reaper, scheduler=scheduler, queues=queues, stop=stop
            )
            tg.cancel_scope.cancel()
    finally:
        await app.aclose()


def serve(app: App, *, scheduler: bool = False, **components: bool) -> None:
    """Run the chosen components in this process until SIGINT/SIGTERM; typed errors exit 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_gc(app.settings)  # this process is the runtime's own
    try:
        anyio.run(lambda: _serve(app, queues=None, scheduler=scheduler, **components))
    except DurableTasksError as exc:
        raise fail(exc) from exc


@cli.command("init-db")
def init_db(app: AppArg) -> None:
    """Create the runtime's tables, or migrate them to the latest version (and create the
    App's own ``tables``)."""
    the_app = load_app(app)
    check(the_app, redis=False)
    try:
        the_app.create_all()
    except DurableTasksError as exc:
        raise fail(exc) from exc
    console().print("tables ready")


@cli.command()
def run(app: AppArg) -> None:
    """Run dispatcher, worker, reaper and (when the App has schedules) a scheduler in one
    process (Ctrl-C stops gracefully)."""
    serve(load_app(app), dispatcher=True, worker=True, reaper=True, scheduler=True)


@cli.command()
def worker(app: AppArg) -> None:
    """Run a worker only."""
    serve(load_app(app), dispatcher=False, worker=True, reaper=False)


@cli.command()
def dispatcher(app: AppArg) -> None:
    """Run a dispatcher only."""
    serve(load_app(app), dispatcher=True, worker=False, reaper=False)


@cli.command()
def reaper(app: AppArg) -> None:
    """Run a reaper (and reconciler) only."""
    serve(load_app(app), dispatcher=False, worker=False, reaper=True)
