"""``durable-tasks web``: serve the dashboard (needs the web extra)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import DurableTasksError

if TYPE_CHECKING:
    from ..agents import Agent
from .base import AppArg, AppOpt, app_spec, check, cli, console, fail, load_app

__all__: list[str] = []


@cli.command()
def web(
    app: AppArg = None,
    app_option: AppOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on; beyond loopback only with DT_WEB_USER/PASSWORD")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8080,
    read_only: Annotated[bool, typer.Option("--read-only", help="Show everything, allow no action")] = False,
    trace_url: Annotated[
        str | None,
        typer.Option(
            envvar="DT_WEB_TRACE_URL", help="Trace UI URL with {trace_id}, e.g. http://jaeger:16686/trace/{trace_id}"
        ),
    ] = None,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between live refreshes when no notification comes")
    ] = 2.0,
) -> None:
    """Serve the web dashboard: queues live, tasks, failures, dead letters, workers, agent runs."""
    try:
        import uvicorn

        from ..web import BasicAuth, check_bind, create_app
    except ImportError as exc:
        console().print("[red]error:[/] the dashboard needs the web extra: pip install 'durable-tasks[web]'")
        raise typer.Exit(2) from exc
    spec = app_spec(app, app_option)
    the_app = load_app(spec)
    auth = BasicAuth.from_env()
    try:
        check_bind(host, authenticated=auth is not None)
    except DurableTasksError as exc:
        raise fail(exc) from exc
    check(the_app, schema=True)  # a dashboard over nothing would serve errors forever
    dashboard = create_app(
        the_app,
        basic_auth=auth,
        read_only=read_only,
        trace_url=trace_url,
        agents=_agents_of(spec),
        poll_interval=timedelta(seconds=poll_interval),
    )
    console().print(f"dashboard on http://{host}:{port}/ (namespace {the_app.settings.namespace})")
    uvicorn.run(dashboard, host=host, port=port, log_level="info", timeout_graceful_shutdown=3)


def _agents_of(spec: str) -> list[Agent]:
    """The Agents defined next to the App (module-level names), for "retry from turn N"."""
    import importlib
    import sys

    module = sys.modules.get(spec.partition(":")[0]) or importlib.import_module(spec.partition(":")[0])
    if "durable_tasks.agents" not in sys.modules:  # the App's module defines no agent
        return []
    from ..agents import Agent

    return [value for value in vars(module).values() if isinstance(value, Agent)]
