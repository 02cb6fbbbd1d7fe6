"""``durable-tasks migrate``: bring the runtime's tables to a version, show the SQL instead, or
check whether steps are missing."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from .. import migrations
from ..app import App
from ..errors import DurableTasksError
from ..outages import database_error
from .base import AppOpt, cli, fail, load_app

__all__ = ["migrate"]

#: ``--check``: steps are missing (errors exit 2, as everywhere).
EXIT_BEHIND = 1


@cli.command()
def migrate(
    app: Annotated[
        str | None,
        typer.Argument(
            metavar="[APP]", help="The App as module:attribute (or --app); without one, the database of DT_DATABASE_URL"
        ),
    ] = None,
    app_option: AppOpt = None,
    to: Annotated[int | None, typer.Option("--to", help="Stop at this version (default: the latest)")] = None,
    sql: Annotated[bool, typer.Option("--sql", help="Print the SQL it would run instead (dry run)")] = False,
    check: Annotated[bool, typer.Option("--check", help="Apply nothing; exit 1 if steps are missing")] = False,
    pre_deploy: Annotated[
        bool,
        typer.Option("--pre-deploy", help="Only the steps this version's code needs (before it starts)"),
    ] = False,
) -> None:
    """Apply the schema steps the database lacks, one transaction each (serialized between
    processes); ``init-db`` does the same to the latest version."""
    spec = app or app_option
    the_app = load_app(spec) if spec else App()
    try:
        if check:
            _check(the_app)
        elif sql:
            with the_app.engine.connect() as conn:
                typer.echo(migrations.render_sql(conn, to=to, pre_deploy=pre_deploy), nl=False)
        else:
            _migrate(the_app, to=to, pre_deploy=pre_deploy)
    except SQLAlchemyError as exc:
        raise fail(database_error(exc, the_app.engine)) from exc
    except DurableTasksError as exc:
        raise fail(exc) from exc
    finally:
        the_app.engine.dispose()


def _migrate(app: App, *, to: int | None, pre_deploy: bool) -> None:
    out = typer.echo
    report = migrations.migrate(
        app.engine,
        to=to,
        pre_deploy=pre_deploy,
        on_wait=lambda: out("another process is migrating this database: waiting for it"),
    )
    if report.adopted:
        out(f"the existing tables match version {report.adopted}: recorded as version {report.adopted}")
    for step in report.applied:
        if step.version > report.adopted:
            out(f"applied {step.label} ({step.phase.value})")
    if report.applied:
        out(f"schema at version {report.after}")
    else:
        out(f"schema at version {report.after}: nothing to do")


def _check(app: App) -> None:
    with app.engine.connect() as conn:
        status = migrations.read_status(conn)
    missing = status.pending
    if not missing:
        typer.echo(f"{status.describe()}: up to date")
        return
    needed = "" if (status.version or 0) >= status.required else "; this code cannot start until they are applied"
    labels = ", ".join(step.label for step in missing)
    typer.echo(f"{status.describe()}: missing {labels}{needed} (run `durable-tasks migrate`)")
    raise typer.Exit(EXIT_BEHIND)
