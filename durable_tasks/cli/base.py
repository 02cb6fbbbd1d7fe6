"""What every command shares: the Typer app, the console, loading the App, running a call
on an event loop with typed errors turned into one line and exit code 2.

Each group of commands lives in a module of its own (``serve``, ``inspect``, ``maintain``)
that registers on :data:`cli`; ``durable_tasks.cli`` imports them all.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import anyio
import typer
from rich.console import Console

from ..app import App
from ..errors import ConfigurationError, DurableTasksError
from ..outages import database_errors

__all__ = ["AppArg", "AppOpt", "app_spec", "call", "check", "cli", "console", "fail", "load_app", "ready", "split_app"]

T = TypeVar("T")

cli = typer.Typer(help="Durable background tasks: outbox → Redis Streams → fenced workers.", no_args_is_help=True)


def console(*, stderr: bool = False) -> Console:
    """A console for this command's output, or for notes beside it on stderr (made per call,
    so the terminal width is read when the command runs)."""
    return Console(stderr=stderr)


AppArg = Annotated[
    str | None,
    typer.Argument(
        metavar="APP", show_default=False, help="The App as module:attribute, e.g. myproject.tasks:app (or --app)"
    ),
]
AppOpt = Annotated[
    str | None,
    typer.Option("--app", envvar="DT_APP", show_default=False, help="The App, when not given as APP (or DT_APP)"),
]

#: What an App spec looks like: a dotted module, a colon, an attribute. Task ids, queue,
#: schedule names and DLQ entry ids never do, so a first positional that does is the APP.
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def app_spec(app: str | None, option: str | None) -> str:
    """The App named positionally, else by ``--app`` / ``DT_APP``."""
    spec = app or option
    if not spec:
        raise fail(ConfigurationError("name the App: APP as module:attribute (e.g. myproject.tasks:app), or --app"))
    return spec


def split_app(
    app: str | None, option: str | None, *values: str | None, names: tuple[str, ...], more: bool = False
) -> tuple[str, list[str]]:
    """The App and a command's own positionals: ``names`` of them, all required (at least
    those with ``more``).

    Both ``tasks show APP TASK_ID`` and ``tasks show TASK_ID --app APP`` (or ``DT_APP``) work:
    every positional is declared optional, and when the first one is not an App spec it
    belongs to the command while the App comes from the option."""
    given = [value for value in (app, *values) if value is not None]
    if given and (option is None or _SPEC.match(given[0])):
        spec, rest = given[0], given[1:]
    else:
        spec, rest = app_spec(None, option), given
    if len(rest) < len(names):
        missing = " ".join(names[len(rest) :])
        raise fail(ConfigurationError(f"missing {missing}: the command takes APP {' '.join(names)}"))
    if len(rest) > len(names) and not more:
        extra = " ".join(rest[len(names) :])
        raise fail(ConfigurationError(f"unexpected {extra}: the command takes APP {' '.join(names)}"))
    return spec, rest


def load_app(spec: str) -> App:
    """Import ``module:attr`` and return the App it names; a bad spec exits 2 in one line."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise fail(ConfigurationError(f"{spec!r} is not module:attribute (e.g. myproject.tasks:app)"))
    sys.path.insert(0, ".")
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except DurableTasksError as exc:
        raise fail(ConfigurationError(f"{spec}: {exc}")) from exc
    except ImportError as exc:
        raise fail(
            ConfigurationError(f"cannot import {module_name} for {spec}: {exc}; run from the project's directory")
        ) from exc
    if not isinstance(obj, App):
        raise fail(ConfigurationError(f"{spec} is not a durable_tasks.App"))
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
