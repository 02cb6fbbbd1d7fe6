"""The ``durable-tasks`` command: schema, runtime processes, status, demo."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from typing import Annotated

import anyio
import typer
from rich.console import Console
from rich.table import Table

from .app import App
from .errors import DurableTasksError

__all__ = ["load_app", "main"]

cli = typer.Typer(help="Durable background tasks: outbox → Redis Streams → fenced workers.", no_args_is_help=True)


def _console() -> Console:
    # Made per call so the terminal width (COLUMNS) is read when the command runs.
    return Console()


AppArg = Annotated[str, typer.Argument(help="The App as module:attribute, e.g. myproject.tasks:app")]


def load_app(spec: str) -> App:
    """Import ``module:attr`` and return the App it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"{spec!r} is not module:attribute")
    sys.path.insert(0, ".")
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except DurableTasksError as exc:
        raise typer.BadParameter(f"{spec}: {exc}") from exc
    if not isinstance(obj, App):
        raise typer.BadParameter(f"{spec} is not a durable_tasks.App")
    return obj


async def _serve(app: App, *, dispatcher: bool, worker: bool, reaper: bool, queues: list[str] | None) -> None:
    stop = anyio.Event()

    async def on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                _console().print(f"[yellow]{signal.Signals(signum).name}: stopping gracefully[/]")
                stop.set()
                return

    try:
        await app.check_connections()  # outside the task group: a typed error, not a group
        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal)
            await app.run(dispatcher=dispatcher, worker=worker, reaper=reaper, queues=queues, stop=stop)
            tg.cancel_scope.cancel()
    finally:
        await app.aclose()


def _run(app: App, **components: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        anyio.run(lambda: _serve(app, queues=None, **components))
    except DurableTasksError as exc:
        _console().print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


@cli.command("init-db")
def init_db(app: AppArg) -> None:
    """Create the dt_tasks, dt_outbox and dt_attempts tables."""
    try:
        load_app(app).create_all()
    except DurableTasksError as exc:
        _console().print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    _console().print("tables ready")


@cli.command()
def run(app: AppArg) -> None:
    """Run dispatcher, worker and reaper in one process (Ctrl-C stops gracefully)."""
    _run(load_app(app), dispatcher=True, worker=True, reaper=True)


@cli.command()
def worker(app: AppArg) -> None:
    """Run a worker only."""
    _run(load_app(app), dispatcher=False, worker=True, reaper=False)


@cli.command()
def dispatcher(app: AppArg) -> None:
    """Run a dispatcher only."""
    _run(load_app(app), dispatcher=True, worker=False, reaper=False)


@cli.command()
def reaper(app: AppArg) -> None:
    """Run a reaper (and reconciler) only."""
    _run(load_app(app), dispatcher=False, worker=False, reaper=True)


@cli.command()
def status(app: AppArg) -> None:
    """Print per-queue statistics: outbox backlog, PEL, delays, DLQ."""
    the_app = load_app(app)

    async def collect() -> Table:
        try:
            stats = await the_app.stats()
        finally:
            await the_app.aclose()
        table = Table(title=f"durable_tasks · namespace {the_app.settings.namespace}")
        table.add_column("queue")
        for column in (
            "outbox_backlog",
            "outbox_oldest_age_s",
            "pel_size",
            "queue_delay_s",
            "oldest_pending_age_s",
            "dlq_length",
        ):
            table.add_column(column, justify="right")
        for queue, s in stats.items():
            d = s.as_dict()
            table.add_row(queue, *(f"{v:.3f}" if isinstance(v, float) else str(v) for v in d.values()))
        return table

    try:
        _console().print(anyio.run(collect))
    except DurableTasksError as exc:
        _console().print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


@cli.command()
def demo(
    tasks: Annotated[int, typer.Option(help="How many tasks to submit")] = 200,
    data_dir: Annotated[str, typer.Option(help="Where the embedded SQLite and Valkey live")] = ".durable_tasks/demo",
) -> None:
    """Submit → dispatch → work → summary on the embedded default (SQLite + Valkey)."""
    from .demo import run_demo

    raise typer.Exit(run_demo(_console(), tasks=tasks, data_dir=data_dir))


def main() -> None:
    """Entry point of the ``durable-tasks`` script."""
    cli()


if __name__ == "__main__":
    main()
