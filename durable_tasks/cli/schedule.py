"""Periodic schedules: the ``scheduler`` role and ``schedules list``, ``pause``, ``resume``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated

import typer

from ..errors import DurableTasksError
from ..scheduler import ScheduleInfo
from .base import AppArg, AppOpt, app_spec, check, cli, fail, load_app, split_app
from .output import Grid, print_json_lines
from .serve import serve

__all__ = ["schedules_grid"]

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


def _state(s: ScheduleInfo) -> str:
    return "paused" if s.paused else "active" if s.declared else "not declared"


def schedules_grid(found: list[ScheduleInfo]) -> Grid:
    """The schedules: name, task, spec, catch-up, state, last and next tick (UTC)."""
    grid = Grid(["schedule", "task", "spec", "catch up", "state", "last tick", "next tick"], title="schedules")
    for s in found:
        grid.add(s.name, s.task, s.spec, s.catch_up, _state(s), _when(s.last_tick), _when(s.next_tick))
    return grid


def _run(spec: str, action: str, name: str | None = None, *, as_json: bool = False) -> None:
    the_app = load_app(spec)
    check(the_app, redis=False, schema=True)
    try:
        if action == "pause" and name is not None:
            the_app.pause_schedule(name)
        elif action == "resume" and name is not None:
            the_app.resume_schedule(name)
        found = the_app.list_schedules()
        if as_json:
            print_json_lines(asdict(s) | {"state": _state(s)} for s in found)
        else:
            schedules_grid(found).print()
    except DurableTasksError as exc:
        raise fail(exc) from exc
    finally:
        the_app.engine.dispose()


@schedules_cli.command("list")
def schedules_list(
    app: AppArg = None,
    app_option: AppOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """Every schedule with its last and next tick (UTC)."""
    _run(app_spec(app, app_option), "list", as_json=as_json)


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
