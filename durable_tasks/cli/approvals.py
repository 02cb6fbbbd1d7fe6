"""Human-in-the-loop: ``approvals list``, ``approvals approve``, ``approvals deny``.

An approval is a signal a suspended task waits for (``durable_tasks.journal``): an agent's
tool call that needs consent, for instance. Listing reads only the open waits (a partial
index), oldest first, a page at a time; answering is ``app.approve``, idempotent: the first
answer stays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated

import typer

from ..app import App
from ..errors import DurableTasksError
from .base import AppArg, AppOpt, app_spec, check, cli, console, fail, load_app, split_app
from .output import Grid

__all__: list[str] = []

approvals_cli = typer.Typer(help="List and answer the approvals suspended tasks wait for.", no_args_is_help=True)
cli.add_typer(approvals_cli, name="approvals")

TaskIdArg = Annotated[str | None, typer.Argument(metavar="TASK_ID", show_default=False, help="The waiting task's id")]
NameArg = Annotated[
    str | None,
    typer.Argument(
        metavar="NAME", show_default=False, help="The approval's name, e.g. approval:call_1 (from `approvals list`)"
    ),
]
ReasonOpt = Annotated[str | None, typer.Option(help="Why: shown to the agent (and kept)")]
ByOpt = Annotated[str | None, typer.Option("--by", help="Who answers (kept with the answer)")]


@approvals_cli.command("list")
def approvals_list(
    app: AppArg = None,
    app_option: AppOpt = None,
    limit: Annotated[int, typer.Option(help="At most this many")] = 50,
    after: Annotated[int, typer.Option(help="Only those listed after this id (the next page)")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """Open approvals, oldest first: task, name, what is asked, since when."""

    def show(the_app: App) -> None:
        pending = the_app.open_approvals(limit=limit, after=after)
        out = console()
        if as_json:
            for p in pending:
                typer.echo(json.dumps(p.as_dict()))
            return
        grid = Grid(["id", "task", "name", "asks", "waiting since"], title="open approvals", numeric=frozenset({"id"}))
        for p in pending:
            asks = json.dumps(p.request) if p.request is not None else ""
            grid.add(p.id, f"{p.task_name} {p.task_id}", p.name, asks, f"{p.since:%Y-%m-%d %H:%M:%S}")
        grid.print(out)
        if len(pending) == limit:
            console(stderr=True).print(f"more: --after {pending[-1].id}", markup=False, highlight=False)

    _sync(app_spec(app, app_option), show)


def _sync(spec: str, action: Callable[[App], None]) -> None:
    """Load the app and run ``action``: these commands make one short transaction each, with
    no event loop; a typed error is one line and exit code 2."""
    the_app = load_app(spec)
    check(the_app, redis=False, schema=True)
    try:
        action(the_app)
    except DurableTasksError as exc:
        raise fail(exc) from exc


def _answer(
    given: tuple[str | None, str | None, str | None, str | None],
    *,
    approved: bool,
    reason: str | None,
    by: str | None,
) -> None:
    app, app_option, *values = given
    spec, (task_id, name) = split_app(app, app_option, *values, names=("TASK_ID", "NAME"))

    def send(the_app: App) -> None:
        delivered = the_app.approve(task_id, name, approved=approved, reason=reason, by=by)
        verdict = "approved" if approved else "denied"
        console().print(f"{verdict}: {task_id} {name}" if delivered else f"already answered: {task_id} {name}")

    _sync(spec, send)


@approvals_cli.command("approve")
def approvals_approve(
    app: AppArg = None,
    task_id: TaskIdArg = None,
    name: NameArg = None,
    app_option: AppOpt = None,
    reason: ReasonOpt = None,
    by: ByOpt = None,
) -> None:
    """Approve: the task resumes (as a new delivery) and the call goes ahead."""
    _answer((app, app_option, task_id, name), approved=True, reason=reason, by=by)


@approvals_cli.command("deny")
def approvals_deny(
    app: AppArg = None,
    task_id: TaskIdArg = None,
    name: NameArg = None,
    app_option: AppOpt = None,
    reason: ReasonOpt = None,
    by: ByOpt = None,
) -> None:
    """Deny: the task resumes and the agent is told the call was denied (with the reason)."""
    _answer((app, app_option, task_id, name), approved=False, reason=reason, by=by)
