"""Flow-control limits (durable_tasks.flow): ``limits list``, ``set`` and ``clear``, changed on
every worker at once without a deploy; ``status`` shows the same table."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from ..app import App
from ..flow.control import LimitInfo
from .base import AppArg, AppOpt, app_spec, call, cli, console, split_app
from .output import Grid, print_json_lines

__all__ = ["limits_grid"]

limits_cli = typer.Typer(
    help="Rate and concurrency limits: list and change them while workers run.", no_args_is_help=True
)
cli.add_typer(limits_cli, name="limits")
NameArg = Annotated[
    str | None,
    typer.Argument(metavar="NAME", show_default=False, help="The limit's name (a task's own: task:<task name>)"),
]


def limits_grid(found: list[LimitInfo]) -> Grid:
    """The limits as admission applies them now; ``set at run time`` marks an override."""
    grid = Grid(
        ["limit", "rate", "burst", "concurrency", "set at run time"],
        title="limits",
        numeric=frozenset({"burst", "concurrency"}),
    )
    for info in found:
        concurrency = "-" if info.concurrency is None else str(info.concurrency)
        grid.add(info.name, info.rate or "-", info.burst, concurrency, "yes" if info.changed else "no")
    return grid


@limits_cli.command("list")
def limits_list(
    app: AppArg = None,
    app_option: AppOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """Every limit of the App, as it applies now."""

    async def show(the_app: App) -> None:
        found = await the_app.limits_status()
        if as_json:
            print_json_lines(asdict(info) for info in found)
        else:
            limits_grid(found).print()

    call(app_spec(app, app_option), show)


@limits_cli.command("set")
def limits_set(
    app: AppArg = None,
    name: NameArg = None,
    app_option: AppOpt = None,
    rate: Annotated[str | None, typer.Option(help="e.g. 3000/m")] = None,
    burst: Annotated[int | None, typer.Option(help="admissions at once")] = None,
    concurrency: Annotated[int | None, typer.Option(help="running attempts per concurrency key")] = None,
) -> None:
    """Override a limit's values on every worker (kept until ``limits clear``)."""
    spec, (limit,) = split_app(app, app_option, name, names=("NAME",))

    async def change(the_app: App) -> None:
        await the_app.set_limit(limit, rate=rate, burst=burst, concurrency=concurrency)
        limits_grid(await the_app.limits_status()).print()

    call(spec, change)


@limits_cli.command("clear")
def limits_clear(app: AppArg = None, name: NameArg = None, app_option: AppOpt = None) -> None:
    """Back to the values the code declares."""
    spec, (limit,) = split_app(app, app_option, name, names=("NAME",))

    async def clear(the_app: App) -> None:
        changed = await the_app.clear_limit(limit)
        console().print(f"{limit}: {'back to the code' if changed else 'had no run-time setting'}")

    call(spec, clear)
