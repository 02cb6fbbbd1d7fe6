"""Reading the system: ``status``, ``tasks``, ``dlq``."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated

import anyio
import typer
from rich.live import Live
from rich.table import Table

from .. import dlq
from ..app import App
from ..errors import InvalidQueryError
from ..views import QueueStats
from .base import AppArg, AppOpt, app_spec, call, cli, console, split_app
from .limits import limits_table
from .schedule import schedules_table

__all__: list[str] = []


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
    app: AppArg = None,
    app_option: AppOpt = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch")] = 2.0,
    count: Annotated[int, typer.Option(help="Stop after this many refreshes (0: never)", hidden=True)] = 0,
) -> None:
    """Per-queue statistics: outbox backlog and age, PEL, delays, stream lag, DLQ; and the
    App's schedules with their next tick."""

    async def show(the_app: App) -> None:
        if not watch:
            console().print(_stats_table(the_app, await the_app.stats()))
            if the_app.schedules:
                console().print(schedules_table(the_app.list_schedules()))
            if limits := await the_app.limits_status():  # flow control (cli/limits.py)
                console().print(limits_table(limits))
            return
        with Live(_stats_table(the_app, await the_app.stats()), console=console()) as live:
            shown = 1
            while not count or shown < count:
                await anyio.sleep(interval)
                live.update(_stats_table(the_app, await the_app.stats()))
                shown += 1

    call(app_spec(app, app_option), show)


tasks_cli = typer.Typer(help="Inspect tasks.", no_args_is_help=True)
TaskIdArg = Annotated[str | None, typer.Argument(metavar="TASK_ID", show_default=False, help="The task id")]
cli.add_typer(tasks_cli, name="tasks")


@tasks_cli.command("show")
def tasks_show(app: AppArg = None, task_id: TaskIdArg = None, app_option: AppOpt = None) -> None:
    """The task, its generations and every attempt with its outcome and reason."""
    spec, (the_id,) = split_app(app, app_option, task_id, names=("TASK_ID",))

    async def show(the_app: App) -> None:
        info = the_app.get_task(the_id)
        out = console()
        out.print(
            f"[bold]{info.name}[/] {info.id} · queue {info.queue} · state [bold]{info.state}[/] · "
            f"generation {info.generation} · attempt {info.attempt} · delivery {info.delivery} · "
            f"reclaims {info.reclaims}"
        )
        if info.error_type:
            out.print(f"error: {info.error_type}: {info.error_message}")
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
        out.print(table)

    call(spec, show)


dlq_cli = typer.Typer(help="The dead-letter queue of a queue.", no_args_is_help=True)
cli.add_typer(dlq_cli, name="dlq")
QueueArg = Annotated[str | None, typer.Argument(metavar="QUEUE", show_default=False, help="The queue name")]
EntryArg = Annotated[str | None, typer.Argument(metavar="ENTRY", show_default=False, help="DLQ entry id")]
EntryOpt = Annotated[list[str] | None, typer.Option("--entry", help="DLQ entry id (repeatable); default all")]


@dlq_cli.command("list")
def dlq_list(app: AppArg = None, queue: QueueArg = None, app_option: AppOpt = None) -> None:
    """The queue's dead letters: entry, task, reason (never the payload)."""
    spec, (name,) = split_app(app, app_option, queue, names=("QUEUE",))

    async def show(the_app: App) -> None:
        table = Table("entry", "task", "name", "generation", "reason")
        for d in await dlq.list_dead_letters(the_app, name):
            table.add_row(d.entry_id, d.task_id or "-", d.name or "-", str(d.generation), d.reason)
        console().print(table)

    call(spec, show, schema=False)


@dlq_cli.command("show")
def dlq_show(app: AppArg = None, queue: QueueArg = None, entry: EntryArg = None, app_option: AppOpt = None) -> None:
    """One dead letter and the task it names."""
    spec, (name, entry_id) = split_app(app, app_option, queue, entry, names=("QUEUE", "ENTRY"))

    async def show(the_app: App) -> None:
        found = [d for d in await dlq.list_dead_letters(the_app, name, count=10_000) if d.entry_id == entry_id]
        if not found:
            raise InvalidQueryError(f"no entry {entry_id} in the DLQ of {name}; see `durable-tasks dlq list`")
        d = found[0]
        console().print(f"entry {d.entry_id}: task {d.task_id} ({d.name}) generation {d.generation}: {d.reason}")
        if d.task_id:
            info = the_app.get_task(d.task_id)
            console().print(f"task state {info.state}, attempts {len(info.attempts)}, error {info.error_message}")

    call(spec, show)


@dlq_cli.command("replay")
def dlq_replay(app: AppArg = None, queue: QueueArg = None, app_option: AppOpt = None, entry: EntryOpt = None) -> None:
    """Run dead-lettered tasks again as a new generation, through the outbox."""
    spec, (name,) = split_app(app, app_option, queue, names=("QUEUE",))
    rerun = call(spec, lambda the_app: dlq.replay(the_app, name, entry))
    console().print(f"replayed {len(rerun)} task(s): {', '.join(rerun)}")


@dlq_cli.command("purge")
def dlq_purge(app: AppArg = None, queue: QueueArg = None, app_option: AppOpt = None, entry: EntryOpt = None) -> None:
    """Delete dead letters (the tasks stay DEAD in the database)."""
    spec, (name,) = split_app(app, app_option, queue, names=("QUEUE",))
    removed = call(spec, lambda the_app: dlq.purge(the_app, name, entry), schema=False)
    console().print(f"purged {removed} entr{'y' if removed == 1 else 'ies'}")
