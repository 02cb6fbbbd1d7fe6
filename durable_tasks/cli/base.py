"""What every command shares: the Typer app, the console, loading the App, running a call
on an event loop with typed errors turned into one line and exit code 2.

Each group of commands lives in a module of its own (``serve``, ``inspect``, ``maintain``)
that registers on :data:`cli`; ``durable_tasks.cli`` imports them all.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import anyio
import typer
from rich.console import Console

from ..app import App
from ..errors import DurableTasksError

__all__ = ["AppArg", "AppOpt", "call", "cli", "console", "fail", "load_app"]

T = TypeVar("T")

cli = typer.Typer(help="Durable background tasks: outbox → Redis Streams → fenced workers.", no_args_is_help=True)


def console() -> Console:
    """A console for this command's output (made per call, so the terminal width is read when
    the command runs)."""
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


def fail(exc: DurableTasksError) -> typer.Exit:
    """Print a typed error as one line; the caller raises the returned exit (code 2)."""
    console().print(f"[red]error:[/] {exc}")
    return typer.Exit(2)


def call(spec: str, action: Callable[[App], Awaitable[T]]) -> T:
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
        raise fail(exc) from exc
