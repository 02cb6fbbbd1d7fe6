"""Periodic schedules: the ``scheduler`` role and ``schedules list``, ``pause``, ``resume``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from ..errors import DurableTasksError
from ..scheduler import ScheduleInfo
from .base import AppArg, AppOpt, app_spec, check, cli, console, fail, load_app, split_app
from .serve import serve

__all__ = ["schedules_table"]

schedules_cli = typer.Typer(
    help="Periodic schedules: list them, pause and resume without a deploy.", no_args_is_help=True
)
cli.add_typer(schedules_cli, name="schedules")
NameArg = Annotated[str | None, typer.Argument(metavar="NAME", show_default=False, help="The schedule's name")]


@cli.command()
def scheduler(app: AppArg = None, app_option: AppOpt = None) -> None:
    """Run a scheduler only: it submits the periodic tasks' ticks (run as many as you like:
    each tick is submitted once)."""
    serve(load_app(app_spec(app, app_option)), ["scheduler"])


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S}Z"


def schedules_table(found: list[ScheduleInfo]) -> Table:
    """The schedules as a table: name, task, spec, catch-up, state, last and next tick (UTC)."""
    table = Table("schedule", "task", "spec", "catch up", "state", "last tick", "next tick", title="schedules")
    for s in found:
        state = "paused" if s.paused else "active" if s.declared else "not declared"
        table.add_row(s.name, s.task, s.spec, s.catch_up, state, _when(s.last_tick), _when(s.next_tick))
    return table


def _run(spec: str, action: str, name: str | None = None) -> None:
    the_app = load_app(spec)
    check(the_app, redis=False, schema=True)
    try:
        if action == "pause" and name is not None:
            the_app.pause_schedule(name)
        elif action == "resume" and name is not None:
            the_app.resume_schedule(name)
        console().print(schedules_table(the_app.list_schedules()))
    except DurableTasksError as exc:
        raise fail(exc) from exc
    finally:
        the_app.engine.dispose()


@schedules_cli.command("list")
def schedules_list(app: AppArg = None, app_option: AppOpt = None) -> None:
    """Every schedule with its last and next tick (UTC)."""
    _run(app_spec(app, app_option), "list")


@schedules_cli.command("pause")
def schedules_pause(app: AppArg = None, name: NameArg = None, app_option: AppOpt = None) -> None:
    """Pause a schedule: every scheduler stops submitting it within scheduler_refresh."""
    spec, (the_name,) = split_app(app, app_option, name, names=("NAME",))
    _run(spec, "pause", the_name)


@schedules_cli.command("resume")
def schedules_resume(app: AppArg = None, name: NameArg = None, app_option: AppOpt = None) -> None:
    """Resume a paused schedule (the ticks that fell while it was paused are skipped)."""
    spec, (the_name,) = split_app(app, app_option, name, names=("NAME",))
    _run(spec, "resume", the_name)
