"""The ``durable-tasks`` command: schema, runtime processes, status, demo."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from . import dlq
from .app import App
from .errors import DurableTasksError
from .process import tune_gc
from .views import QueueStats

__all__ = ["load_app", "main"]

T = TypeVar("T")

cli = typer.Typer(help="Durable background tasks: outbox → Redis Streams → fenced workers.", no_args_is_help=True)


def _console() -> Console:
    # Made per call so the terminal width (COLUMNS) is read when the command runs.
    return Console()


AppArg = Annotated[str, typer.Argument(help="The App as module:attribute, e.g. myproject.tasks:app")]
AppOpt = Annotated[str, typer.Option("--app", envvar="DT_APP", help="The App as module:attribute (or DT_APP)")]


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
        # Outside the task group: a typed error, not a group.
        await app.check_connections(wait=app.settings.startup_wait)
        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal)
            await app.run(dispatcher=dispatcher, worker=worker, reaper=reaper, queues=queues, stop=stop)
            tg.cancel_scope.cancel()
    finally:
        await app.aclose()


def _run(app: App, **components: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_gc(app.settings)  # this process is the runtime's own
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


def _call(spec: str, action: Callable[[App], Awaitable[T]]) -> T:
    """Load the app, run ``action`` on an event loop, close the app; typed errors exit 2."""
    the_app = load_app(spec)

    async def go() -> T:
        try:
            return await action(the_app)
        finally:
            await the_app.aclose()

    try:
        return anyio.run(go)
    except DurableTasksError as exc:
        _console().print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def _stats_table(app: App, stats: dict[str, QueueStats]) -> Table:
    table = Table(title=f"durable_tasks · namespace {app.settings.namespace}")
    table.add_column("queue")
    for column in (f.name for f in fields(QueueStats)):
        table.add_column(column, justify="right")
    for queue, s in stats.items():
        table.add_row(queue, *(f"{v:.3f}" if isinstance(v, float) else str(v) for v in s.as_dict().values()))
    return table


@cli.command()
def status(
    app: AppArg,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch")] = 2.0,
    count: Annotated[int, typer.Option(help="Stop after this many refreshes (0: never)", hidden=True)] = 0,
) -> None:
    """Per-queue statistics: outbox backlog and age, PEL, delays, stream lag, DLQ."""

    async def show(the_app: App) -> None:
        if not watch:
            _console().print(_stats_table(the_app, await the_app.stats()))
            return
        with Live(_stats_table(the_app, await the_app.stats()), console=_console()) as live:
            shown = 1
            while not count or shown < count:
                await anyio.sleep(interval)
                live.update(_stats_table(the_app, await the_app.stats()))
                shown += 1

    _call(app, show)


tasks_cli = typer.Typer(help="Inspect tasks.", no_args_is_help=True)
cli.add_typer(tasks_cli, name="tasks")


@tasks_cli.command("show")
def tasks_show(task_id: Annotated[str, typer.Argument(help="The task id")], app: AppOpt) -> None:
    """The task, its generations and every attempt with its outcome and reason."""

    async def show(the_app: App) -> None:
        info = the_app.get_task(task_id)
        console = _console()
        console.print(
            f"[bold]{info.name}[/] {info.id} · queue {info.queue} · state [bold]{info.state}[/] · "
            f"generation {info.generation} · attempt {info.attempt} · delivery {info.delivery} · "
            f"reclaims {info.reclaims}"
        )
        if info.error_type:
            console.print(f"error: {info.error_type}: {info.error_message}")
        table = Table("generation", "attempt", "delivery", "worker", "started", "finished", "outcome", "reason")
        for a in info.attempts:
            reason = a.retry_reason or (f"{a.error_type}: {a.error_message}" if a.error_type else "")
            table.add_row(
                str(a.generation),
                str(a.attempt),
                str(a.delivery),
                a.worker_id,
                f"{a.started_at:%H:%M:%S.%f}",
                f"{a.finished_at:%H:%M:%S.%f}" if a.finished_at else "",
                a.outcome or "running",
                reason,
            )
        console.print(table)

    _call(app, show)


dlq_cli = typer.Typer(help="The dead-letter queue of a queue.", no_args_is_help=True)
cli.add_typer(dlq_cli, name="dlq")
QueueArg = Annotated[str, typer.Argument(help="The queue name")]
EntryOpt = Annotated[list[str] | None, typer.Option("--entry", help="DLQ entry id (repeatable); default all")]


@dlq_cli.command("list")
def dlq_list(queue: QueueArg, app: AppOpt) -> None:
    """The queue's dead letters: entry, task, reason (never the payload)."""

    async def show(the_app: App) -> None:
        table = Table("entry", "task", "name", "generation", "reason")
        for d in await dlq.list_dead_letters(the_app, queue):
            table.add_row(d.entry_id, d.task_id or "-", d.name or "-", str(d.generation), d.reason)
        _console().print(table)

    _call(app, show)


@dlq_cli.command("show")
def dlq_show(queue: QueueArg, entry: Annotated[str, typer.Argument(help="DLQ entry id")], app: AppOpt) -> None:
    """One dead letter and the task it names."""

    async def show(the_app: App) -> None:
        found = [d for d in await dlq.list_dead_letters(the_app, queue, count=10_000) if d.entry_id == entry]
        if not found:
            raise typer.BadParameter(f"no entry {entry} in the DLQ of {queue}")
        d = found[0]
        _console().print(f"entry {d.entry_id}: task {d.task_id} ({d.name}) generation {d.generation}: {d.reason}")
        if d.task_id:
            info = the_app.get_task(d.task_id)
            _console().print(f"task state {info.state}, attempts {len(info.attempts)}, error {info.error_message}")

    _call(app, show)


@dlq_cli.command("replay")
def dlq_replay(queue: QueueArg, app: AppOpt, entry: EntryOpt = None) -> None:
    """Run dead-lettered tasks again as a new generation, through the outbox."""
    rerun = _call(app, lambda the_app: dlq.replay(the_app, queue, entry))
    _console().print(f"replayed {len(rerun)} task(s): {', '.join(rerun)}")


@dlq_cli.command("purge")
def dlq_purge(queue: QueueArg, app: AppOpt, entry: EntryOpt = None) -> None:
    """Delete dead letters (the tasks stay DEAD in the database)."""
    removed = _call(app, lambda the_app: dlq.purge(the_app, queue, entry))
    _console().print(f"purged {removed} entr{'y' if removed == 1 else 'ies'}")


@cli.command()
def prune(
    app: AppArg,
    older_than: Annotated[float, typer.Option(help="Age in hours of what may go")] = 24 * 7,
    batch: Annotated[int, typer.Option(help="Rows per transaction")] = 1000,
) -> None:
    """Delete sent outbox rows and finished tasks older than --older-than, in bounded batches."""
    from datetime import timedelta

    the_app = load_app(app)
    try:
        report = the_app.prune(timedelta(hours=older_than), batch=batch)
    except DurableTasksError as exc:
        _console().print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    _console().print(
        f"pruned {report.tasks} task(s), {report.attempts} attempt(s), {report.outbox_rows} outbox row(s) "
        f"in {report.batches} batch(es)"
    )


@cli.command()
def doctor(app: AppArg) -> None:
    """Check what would lose or duplicate work: eviction, persistence, version, groups, clocks,
    timeouts, dedup TTL, trimming. Exits 1 on an error-level finding."""
    from .doctor import Level, diagnose, gather_facts

    findings = _call(app, lambda the_app: _facts_then(the_app, gather_facts, diagnose))
    table = Table("check", "level", "finding")
    colors = {Level.OK: "green", Level.WARNING: "yellow", Level.ERROR: "red"}
    for f in findings:
        table.add_row(f.check, f"[{colors[f.level]}]{f.level.value}[/]", f.message)
    _console().print(table)
    if any(f.level is Level.ERROR for f in findings):
        raise typer.Exit(1)


async def _facts_then(app: App, gather: Callable[[App], Awaitable[Any]], judge: Callable[[Any], T]) -> T:
    return judge(await gather(app))


@cli.command()
def demo(
    part: Annotated[str, typer.Argument(help="judge, agent, or all")] = "all",
    data_dir: Annotated[str, typer.Option(help="Where the demo's SQLite file and Valkey live")] = ".durable_tasks/demo",
    trace: Annotated[
        str | None, typer.Option(help="Export every process's spans to this file and draw one trace")
    ] = None,
) -> None:
    """The two users end to end on the embedded default: an online judge (worker killed
    mid-task, a rejudge in flight) and a durable agent run; exits 1 if an invariant fails."""
    if part not in ("judge", "agent", "all"):
        raise typer.BadParameter("part must be judge, agent or all")
    sys.path.insert(0, ".")
    try:
        from examples import demo as demo_module
    except ImportError as exc:
        raise typer.BadParameter("the demo lives in the repository's examples/: run it from the repo root") from exc
    raise typer.Exit(demo_module.run(_console(), part, Path(data_dir), Path(trace) if trace else None))


def main() -> None:
    """Entry point of the ``durable-tasks`` script."""
    cli()


if __name__ == "__main__":
    main()
