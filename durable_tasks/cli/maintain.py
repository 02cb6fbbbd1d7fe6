"""Looking after the system: ``prune``, ``doctor``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ..app import App
from ..errors import DurableTasksError
from ..outages import broker_errors, database_errors
from .base import AppArg, AppOpt, app_spec, call, check, cli, console, fail, load_app
from .output import Grid, print_json_lines

__all__: list[str] = []

T = TypeVar("T")


@cli.command()
def prune(
    app: AppArg = None,
    app_option: AppOpt = None,
    older_than: Annotated[float, typer.Option(help="Age in hours of what may go")] = 24 * 7,
    batch: Annotated[int, typer.Option(help="Rows per transaction")] = 1000,
    pause: Annotated[
        bool,
        typer.Option(
            help="Pause between batches so running workers keep their pace (never below DT_RETENTION_MIN_RATE tasks/s)"
        ),
    ] = True,
) -> None:
    """Delete sent outbox rows and finished tasks older than --older-than, in bounded batches."""
    the_app = load_app(app_spec(app, app_option))
    check(the_app, redis=False, schema=True)
    try:
        report = the_app.prune(timedelta(hours=older_than), batch=batch, paced=pause)
    except DurableTasksError as exc:
        raise fail(exc) from exc
    console().print(
        f"pruned {report.tasks} task(s), {report.attempts} attempt(s), {report.outbox_rows} outbox row(s) "
        f"in {report.batches} batch(es)"
    )


@cli.command()
def doctor(
    app: AppArg = None,
    app_option: AppOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per finding, one per line")] = False,
) -> None:
    """Check what would lose or duplicate work: eviction, persistence, version, groups, clocks,
    timeouts, dedup TTL, trimming, a pooler in front of PostgreSQL, LISTEN/NOTIFY. Exits 1 on an
    error-level finding."""
    from ..doctor import Level, diagnose, gather_facts

    # The schema is one of the findings: only the connections must work first.
    spec = app_spec(app, app_option)
    findings = call(spec, lambda the_app: _facts_then(the_app, gather_facts, diagnose), schema=False)
    if as_json:
        print_json_lines({"check": f.check, "level": f.level.value, "message": f.message} for f in findings)
    else:
        grid = Grid(["check", "level", "finding"])
        colors = {Level.OK: "green", Level.WARNING: "yellow", Level.ERROR: "red"}
        for f in findings:
            grid.add(f.check, f"[{colors[f.level]}]{f.level.value}[/]", escape(f.message))
        grid.print()
    if any(f.level is Level.ERROR for f in findings):
        raise typer.Exit(1)


async def _facts_then(app: App, gather: Callable[[App], Awaitable[Any]], judge: Callable[[Any], T]) -> T:
    # A server that goes away between the check and the facts is still one line.
    with database_errors(lambda: app.engine), broker_errors(lambda: app.redis_url):
        return judge(await gather(app))
