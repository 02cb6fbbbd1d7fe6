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
from ..outages import database_errors

__all__ = ["AppArg", "AppOpt", "call", "check", "cli", "console", "fail", "load_app", "ready"]

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
    """Print a typed error as one line on stderr (never wrapped, whatever the terminal's
    width); the caller raises the returned exit (code 2)."""
    message = " ".join(str(exc).split())
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {message}", markup=True, highlight=False)
    return typer.Exit(2)


async def ready(app: App, *, redis: bool = True, schema: bool = False) -> None:
    """Check, once, that the database (and Redis, unless ``redis`` is False) answer, and that
    the schema is one this code runs on when ``schema``: a command fails on these with one
    line before it does anything, instead of serving or retrying with nothing underneath."""
    if redis:
        await app.check_connections()
    else:
        with database_errors(lambda: app.engine):
            await anyio.to_thread.run_sync(lambda: app.engine.connect().close())
    if schema:
        await anyio.to_thread.run_sync(app.check_schema)


def check(app: App, *, redis: bool = True, schema: bool = False) -> None:
    """:func:`ready` from a command that has no event loop; a typed error exits 2."""

    async def go() -> None:
        try:
            await ready(app, redis=redis, schema=schema)
        finally:
            await app.aclose()

    try:
        anyio.run(go)
    except DurableTasksError as exc:
        raise fail(exc) from exc


def call(spec: str, action: Callable[[App], Awaitable[T]], *, schema: bool = True) -> T:
    """Load the app, check its connections (and schema, when ``schema``), run ``action`` on an
    event loop, close the app; typed errors exit 2."""
    the_app = load_app(spec)

    async def go() -> T:
        try:
            await ready(the_app, schema=schema)
            return await action(the_app)
        finally:
            await the_app.aclose()

    try:
        return anyio.run(go)
    except DurableTasksError as exc:
        raise fail(exc) from exc
