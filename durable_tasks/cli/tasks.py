"""Tasks, one by one or by filter: ``tasks list``, ``show``, ``rerun``, ``cancel``.

Lists go through :mod:`durable_tasks.readmodel` (keyed, paged, newest first); acting goes
through the App's public ``rerun`` and ``cancel``, one transaction per task, so a bulk action
that stops half-way has done whole tasks and says which.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio
import typer
from sqlmodel import Session

from .. import readmodel
from ..app import App
from ..errors import DurableTasksError, InvalidQueryError
from ..views import TaskInfo
from .base import AppArg, AppOpt, call, cli, console, fail, split_app
from .output import Grid, print_json, print_json_lines

__all__: list[str] = []

tasks_cli = typer.Typer(help="List, show, rerun and cancel tasks.", no_args_is_help=True)
cli.add_typer(tasks_cli, name="tasks")

TaskIdArg = Annotated[str | None, typer.Argument(metavar="TASK_ID", show_default=False, help="The task id")]
TaskIdsArg = Annotated[
    list[str] | None, typer.Argument(metavar="TASK_ID...", show_default=False, help="Task ids (or a filter)")
]
StateOpt = Annotated[str | None, typer.Option("--state", help="PENDING, RUNNING, FAILED, DEAD, SUCCEEDED…")]
NameOpt = Annotated[str | None, typer.Option("--name", help="The task's name")]
QueueOpt = Annotated[str | None, typer.Option("--queue", help="The queue")]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="Submitted since: 30m, 2h, 7d, or a time (2026-05-01T12:00)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON (one object per line for a list)")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Act on a filter's tasks without asking")]

_AGO = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since_moment(text: str, now: datetime) -> datetime:
    """``30m`` / ``2h`` / ``7d`` before ``now``, or an ISO 8601 time (UTC when it names no zone)."""
    ago = _AGO.match(text.strip())
    if ago:
        return now - timedelta(**{_UNITS[ago["unit"]]: float(ago["n"])})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidQueryError(f"--since {text!r}: use 30m, 2h, 7d or a time like 2026-05-01T12:00") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _filter(
    app: App, state: str | None, name: str | None, queue: str | None, since: str | None
) -> readmodel.TaskFilter:
    moment = since_moment(since, app.clock()) if since else None
    return readmodel.TaskFilter(name=name, state=state.upper() if state else None, queue=queue, since=moment)


def _row(t: readmodel.TaskRow) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "queue": t.queue,
        "state": t.state,
        "generation": t.generation,
        "attempt": t.attempt,
        "created_at": t.created_at,
        "finished_at": t.finished_at,
        "error": f"{t.error_type}: {t.error_message}" if t.error_type else None,
    }


@tasks_cli.command("list")
def tasks_list(
    app: AppArg = None,
    app_option: AppOpt = None,
    state: StateOpt = None,
    name: NameOpt = None,
    queue: QueueOpt = None,
    since: SinceOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many (1-500)")] = 50,
    after: Annotated[str | None, typer.Option(help="The next page: the cursor the last page printed")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Tasks newest first, by state, name, queue and submit time: FAILED and DEAD ones first of all."""

    async def show(the_app: App) -> None:
        flt = _filter(the_app, state, name, queue, since)
        engine = the_app.runtime.store.read_engine
        ns = the_app.settings.namespace
        page = await anyio.to_thread.run_sync(lambda: readmodel.list_tasks(engine, ns, flt, cursor=after, limit=limit))
        if as_json:
            print_json_lines(_row(t) for t in page.items)
        else:
            grid = Grid(["id", "name", "queue", "state", "gen", "attempt", "created", "error"], numeric=_NUMBERS)
            for t in page.items:
                error = f"{t.error_type}: {t.error_message}" if t.error_type else ""
                grid.add(
                    t.id, t.name, t.queue, t.state, t.generation, t.attempt, f"{t.created_at:%Y-%m-%d %H:%M:%S}", error
                )
            grid.print()
        if page.next_cursor:
            console(stderr=True).print(f"more: --after '{page.next_cursor}'", markup=False, highlight=False)

    call(split_app(app, app_option, names=())[0], show)


_NUMBERS = frozenset({"gen", "attempt", "delivery", "generation"})


def _show_json(info: TaskInfo) -> dict[str, Any]:
    out = {k: getattr(info, k) for k in info.__dataclass_fields__ if k not in ("attempts", "payload")}
    out["state"] = str(info.state)
    out["attempts"] = [
        {k: getattr(a, k) for k in a.__dataclass_fields__} | {"outcome": a.outcome and str(a.outcome)}
        for a in info.attempts
    ]
    return out


@tasks_cli.command("show")
def tasks_show(
    app: AppArg = None, task_id: TaskIdArg = None, app_option: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """The task, its result or error, every attempt with its outcome and reason, and the
    traceback of each failed attempt."""
    spec, (the_id,) = split_app(app, app_option, task_id, names=("TASK_ID",))

    async def show(the_app: App) -> None:
        info = the_app.get_task(the_id)
        if as_json:
            print_json(_show_json(info))
            return
        out = console()
        out.print(
            f"[bold]{info.name}[/] {info.id} · queue {info.queue} · state [bold]{info.state}[/] · "
            f"generation {info.generation} · attempt {info.attempt} · delivery {info.delivery} · "
            f"reclaims {info.reclaims}",
            soft_wrap=True,
        )
        if info.result is not None:
            out.print("result:", _json_text(info.result), markup=False, highlight=False, soft_wrap=True)
        if info.error_type:
            out.print(f"error: {info.error_type}: {info.error_message}", markup=False, soft_wrap=True)
        grid = Grid(
            ["generation", "attempt", "delivery", "worker", "started", "finished", "outcome", "reason"],
            numeric=_NUMBERS,
        )
        for a in info.attempts:
            reason = a.retry_reason or (f"{a.error_type}: {a.error_message}" if a.error_type else "")
            grid.add(
                a.generation,
                a.attempt,
                a.delivery,
                a.worker_id,
                f"{a.started_at:%H:%M:%S.%f}",
                f"{a.finished_at:%H:%M:%S.%f}" if a.finished_at else "",
                a.outcome or "running",
                reason,
            )
        grid.print(out)
        for a in info.attempts:
            if a.traceback:
                out.print(f"\ntraceback of generation {a.generation}, attempt {a.attempt}:", markup=False)
                out.print(a.traceback.rstrip(), markup=False, highlight=False, soft_wrap=True)

    call(spec, show)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _targets(the_app: App, ids: list[str], flt: readmodel.TaskFilter, *, limit: int) -> list[str]:
    if ids:
        return ids
    engine = the_app.runtime.store.read_engine
    ns = the_app.settings.namespace
    found: list[str] = []
    cursor: str | None = None
    while len(found) < limit:
        page = readmodel.list_tasks(engine, ns, flt, cursor=cursor, limit=min(500, limit - len(found)))
        found += [t.id for t in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return found


def _act(
    verb: str,
    given: tuple[str | None, str | None, list[str] | None],
    filters: tuple[str | None, str | None, str | None, str | None],
    *,
    yes: bool,
    limit: int,
) -> None:
    app, app_option, ids = given
    spec, rest = split_app(app, app_option, *(ids or []), names=(), more=True)
    if rest and any(filters):
        raise fail(InvalidQueryError(f"tasks {verb}: give task ids or a filter (--state, --name, …), not both"))
    if not rest and not any(filters):
        raise fail(InvalidQueryError(f"tasks {verb}: give task ids, or a filter such as --state FAILED"))

    async def act(the_app: App) -> None:
        targets = await anyio.to_thread.run_sync(
            lambda: _targets(the_app, rest, _filter(the_app, *filters), limit=limit)
        )
        if not rest:
            if not targets:
                console().print(f"no task matches: nothing to {verb}")
                return
            if not yes:
                if not sys.stdin.isatty():
                    raise InvalidQueryError(f"{len(targets)} task(s) match: pass --yes to {verb} them")
                if not typer.confirm(f"{verb} {len(targets)} task(s)?"):
                    raise typer.Exit(1)
        await anyio.to_thread.run_sync(lambda: _apply(the_app, verb, targets))

    call(spec, act)


def _apply(app: App, verb: str, targets: list[str]) -> None:
    done: list[str] = []
    skipped: list[str] = []
    problems: list[str] = []
    for task_id in targets:
        try:
            with Session(app.engine) as session:
                if verb == "rerun":
                    generation = app.rerun(session, task_id)
                    done.append(f"{task_id} (generation {generation})")
                elif app.cancel(session, task_id):
                    done.append(task_id)
                else:
                    skipped.append(task_id)
                session.commit()
        except DurableTasksError as exc:
            problems.append(str(exc))
    past = {"rerun": "rerun", "cancel": "cancelled"}[verb]
    out = console()
    if done:
        out.print(f"{past} {len(done)} task(s): {', '.join(done)}", markup=False, soft_wrap=True)
    if skipped:
        out.print(f"already final, left alone: {', '.join(skipped)}", markup=False, soft_wrap=True)
    if problems:
        raise fail(InvalidQueryError("; ".join(problems)))


LimitOpt = Annotated[int, typer.Option(min=1, help="With a filter: at most this many, newest first")]


def _bulk_command(verb: str, summary: str) -> None:
    """Register ``tasks <verb>``, which acts on tasks by id or by filter through :func:`_act`."""

    def command(
        app: AppArg = None,
        task_ids: TaskIdsArg = None,
        app_option: AppOpt = None,
        state: StateOpt = None,
        name: NameOpt = None,
        queue: QueueOpt = None,
        since: SinceOpt = None,
        limit: LimitOpt = 1000,
        yes: YesOpt = False,
    ) -> None:
        _act(verb, (app, app_option, task_ids), (state, name, queue, since), yes=yes, limit=limit)

    command.__doc__ = f"{summary}: by id, or every task a filter matches (asks first, unless --yes)."
    tasks_cli.command(verb)(command)


_bulk_command("rerun", "Run tasks again as a new generation (older ones are fenced out)")
_bulk_command("cancel", "Cancel tasks not yet final (a running attempt's result is fenced out)")
