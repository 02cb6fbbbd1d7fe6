"""Reading the system: ``status``, ``tasks``, ``dlq``."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Annotated, Any

import anyio
import typer
from rich.live import Live

from .. import dlq, readmodel
from ..app import App
from ..errors import InvalidQueryError
from ..views import QueueStats
from .base import AppArg, AppOpt, app_spec, call, cli, console, split_app
from .limits import limits_grid
from .output import Grid, print_json, print_json_lines
from .schedule import schedules_grid

__all__: list[str] = []


#: Final states a queue's row counts, from the database (the DLQ column is Redis' stream).
_FINAL_COUNTED = ("FAILED", "DEAD")


def _stats_grid(app: App, stats: dict[str, QueueStats], finals: dict[tuple[str, str], int]) -> Grid:
    names = [f.name for f in fields(QueueStats)]
    headers = ["queue", *names, *(state.lower() for state in _FINAL_COUNTED)]
    grid = Grid(headers, title=f"durable_tasks · namespace {app.settings.namespace}", numeric=frozenset(headers[1:]))
    for queue, s in stats.items():
        numbers = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in s.as_dict().values()]
        grid.add(queue, *numbers, *(_capped(finals.get((queue, state), 0)) for state in _FINAL_COUNTED))
    return grid


def _capped(n: int) -> str:
    return f"{readmodel.COUNT_CAP:,}+" if n > readmodel.COUNT_CAP else str(n)


async def _snapshot(app: App) -> tuple[dict[str, QueueStats], dict[tuple[str, str], int]]:
    """The queues' stats and their FAILED and DEAD counts (each capped: an index range each)."""
    stats = await app.stats()
    engine = app.runtime.store.read_engine
    queues = sorted(set(stats) | set(app.runtime.queues()))
    finals = await anyio.to_thread.run_sync(
        lambda: readmodel.state_counts(engine, app.settings.namespace, queues, _FINAL_COUNTED)
    )
    for queue in queues:
        stats.setdefault(queue, QueueStats(0, 0.0, 0, 0.0, 0.0, 0))
    return stats, finals


def _status_json(app: App, stats: dict[str, QueueStats], finals: dict[tuple[str, str], int]) -> dict[str, Any]:
    return {
        "namespace": app.settings.namespace,
        "queues": {
            q: s.as_dict() | {state.lower(): finals.get((q, state), 0) for state in _FINAL_COUNTED}
            for q, s in stats.items()
        },
    }


@cli.command()
def status(
    app: AppArg = None,
    app_option: AppOpt = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch")] = 2.0,
    count: Annotated[int, typer.Option(help="Stop after this many refreshes (0: never)", hidden=True)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: the numbers per queue")] = False,
) -> None:
    """Per-queue statistics: outbox backlog and age, PEL, delays, stream lag, DLQ, tasks
    FAILED and DEAD; and the App's schedules with their next tick."""

    async def show(the_app: App) -> None:
        if as_json:
            print_json(_status_json(the_app, *await _snapshot(the_app)))
            return
        if not watch:
            _stats_grid(the_app, *await _snapshot(the_app)).print()
            if the_app.schedules:
                schedules_grid(the_app.list_schedules()).print()
            if limits := await the_app.limits_status():  # flow control (cli/limits.py)
                limits_grid(limits).print()
            return
        with Live(_stats_grid(the_app, *await _snapshot(the_app)).table(), console=console()) as live:
            shown = 1
            while not count or shown < count:
                await anyio.sleep(interval)
                live.update(_stats_grid(the_app, *await _snapshot(the_app)).table())
                shown += 1

    call(app_spec(app, app_option), show)


dlq_cli = typer.Typer(help="The dead-letter queue of a queue.", no_args_is_help=True)
cli.add_typer(dlq_cli, name="dlq")
QueueArg = Annotated[str | None, typer.Argument(metavar="QUEUE", show_default=False, help="The queue name")]
EntryArg = Annotated[str | None, typer.Argument(metavar="ENTRY", show_default=False, help="DLQ entry id")]
EntryOpt = Annotated[list[str] | None, typer.Option("--entry", help="DLQ entry id (repeatable); default all")]


@dlq_cli.command("list")
def dlq_list(
    app: AppArg = None,
    queue: QueueArg = None,
    app_option: AppOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many, oldest first")] = 100,
    after: Annotated[str | None, typer.Option(help="Only entries after this entry id (the next page)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON (one object per line for a list)")] = False,
) -> None:
    """The queue's dead letters, oldest first: entry, task, reason (never the payload)."""
    spec, (name,) = split_app(app, app_option, queue, names=("QUEUE",))

    async def show(the_app: App) -> None:
        found = await dlq.list_dead_letters(the_app, name, count=limit, after=after)
        if as_json:
            print_json_lines(asdict(d) for d in found)
            return
        grid = Grid(["entry", "task", "name", "generation", "reason"], numeric=frozenset({"generation"}))
        for d in found:
            grid.add(d.entry_id, d.task_id or "-", d.name or "-", d.generation, d.reason)
        grid.print()
        if len(found) == limit:
            console(stderr=True).print(f"more: --after {found[-1].entry_id}", markup=False, highlight=False)

    call(spec, show, schema=False)


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id`` (``5-0`` before ``5-1``; ``4-18446744073709551615``
    before ``5-0``): an exclusive start that lands on the entry itself."""
    ms, _, seq = entry_id.partition("-")
    if not ms.isdigit() or not (seq or "0").isdigit():
        raise InvalidQueryError(f"{entry_id!r} is not a DLQ entry id (like 1717171717171-0); see `dlq list`")
    if int(seq or 0) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-18446744073709551615" if int(ms) > 0 else "0-0"


@dlq_cli.command("show")
def dlq_show(
    app: AppArg = None,
    queue: QueueArg = None,
    entry: EntryArg = None,
    app_option: AppOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON (one object per line for a list)")] = False,
) -> None:
    """One dead letter and the task it names."""
    spec, (name, entry_id) = split_app(app, app_option, queue, entry, names=("QUEUE", "ENTRY"))

    async def show(the_app: App) -> None:
        # XRANGE entry_id entry_id: the one entry, however long the DLQ (an id is its own key)
        found = [
            d
            for d in await dlq.list_dead_letters(the_app, name, count=1, after=_before(entry_id))
            if d.entry_id == entry_id
        ]
        if not found:
            raise InvalidQueryError(f"no entry {entry_id} in the DLQ of {name}; see `durable-tasks dlq list`")
        d = found[0]
        info = the_app.get_task(d.task_id) if d.task_id else None
        if as_json:
            task = None
            if info is not None:
                task = {"state": str(info.state), "attempts": len(info.attempts), "error": info.error_message}
            print_json(asdict(d) | {"task": task})
            return
        out = console()
        out.print(
            f"entry {d.entry_id}: task {d.task_id} ({d.name}) generation {d.generation}: {d.reason}",
            markup=False,
            soft_wrap=True,
        )
        if info is not None:
            out.print(
                f"task state {info.state}, attempts {len(info.attempts)}, error {info.error_message}",
                markup=False,
                soft_wrap=True,
            )
            out.print(f"more: durable-tasks tasks show APP {info.id}", markup=False, highlight=False)

    call(spec, show)


@dlq_cli.command("replay")
def dlq_replay(app: AppArg = None, queue: QueueArg = None, app_option: AppOpt = None, entry: EntryOpt = None) -> None:
    """Run dead-lettered tasks again as a new generation, through the outbox: the entries given,
    wherever they stand in the DLQ, or every entry. Exits 1 when entries were given and none
    of them was replayed."""
    spec, (name,) = split_app(app, app_option, queue, names=("QUEUE",))
    done = call(spec, lambda the_app: dlq.replay(the_app, name, entry))
    out = console()
    out.print(f"replayed {len(done.rerun)} task(s): {', '.join(done.rerun)}", markup=False, soft_wrap=True)
    for entries, what in [
        (done.rerun_since, "rerun since they were dead-lettered (removed)"),
        (done.kept, "left in the DLQ (no task to rerun, or not DEAD at their generation)"),
    ]:
        if entries:
            out.print(f"{len(entries)} entr(y/ies) {what}: {', '.join(entries)}", markup=False, soft_wrap=True)
    if done.not_found:
        console(stderr=True).print(
            f"not in the DLQ of {name}: {', '.join(done.not_found)}; see `durable-tasks dlq list`",
            markup=False,
            soft_wrap=True,
        )
    if entry and not done.rerun:
        raise typer.Exit(1)


@dlq_cli.command("purge")
def dlq_purge(app: AppArg = None, queue: QueueArg = None, app_option: AppOpt = None, entry: EntryOpt = None) -> None:
    """Delete dead letters (the tasks stay DEAD in the database)."""
    spec, (name,) = split_app(app, app_option, queue, names=("QUEUE",))
    removed = call(spec, lambda the_app: dlq.purge(the_app, name, entry), schema=False)
    console().print(f"purged {removed} entr{'y' if removed == 1 else 'ies'}")
