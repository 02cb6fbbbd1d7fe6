"""The web dashboard: every queue, task, attempt, failure and agent run, live; actions guarded.

Install with ``pip install 'durable-tasks[web]'``. Two ways to serve it::

    from durable_tasks.web import create_app
    dashboard = create_app(app)              # a FastAPI app: uvicorn.run(dashboard, port=8080)

    from durable_tasks.web import create_router
    api.include_router(create_router(app, dependencies=[Depends(my_auth)]), prefix="/tasks")

or ``durable-tasks web APP``. :func:`create_app` asks for HTTP Basic credentials when
``DT_WEB_USER`` and ``DT_WEB_PASSWORD`` are set; a mounted router is guarded by the
``dependencies`` given (the host application's own auth).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

try:
    from fastapi import APIRouter, Depends, FastAPI, Request
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the dashboard needs the web extra: pip install 'durable-tasks[web]'") from exc

from ..app import App
from .actions import add_actions
from .context import Dashboard
from .pages import add_pages
from .security import BasicAuth, Csrf, check_bind

if TYPE_CHECKING:
    from ..agents import Agent

__all__ = ["BasicAuth", "check_bind", "create_app", "create_router"]


def create_router(
    app: App,
    *,
    dependencies: Sequence[Any] = (),
    read_only: bool = False,
    trace_url: str | None = None,
    agents: Iterable[Agent] = (),
    actor: Callable[[Request], str] | None = None,
    poll_interval: timedelta = timedelta(seconds=2),
    secret: bytes | None = None,
) -> APIRouter:
    """The dashboard as a router, to mount in any FastAPI app (with a prefix, or at the root).

    ``dependencies`` guard every route (pass your auth: ``[Depends(current_admin)]``); ``actor``
    names who acts in the audit log (default: the Basic-auth user, else "anonymous").
    ``read_only`` hides every action and refuses it. ``trace_url`` is the trace UI's URL with
    ``{trace_id}`` in it (e.g. ``http://jaeger:16686/trace/{trace_id}``). ``agents`` enables
    "retry from turn N" for their runs. ``secret`` signs CSRF tokens (default: random per
    process, so a restart asks browsers to reload).
    """
    dashboard = Dashboard(
        app,
        read_only=read_only,
        trace_url=trace_url,
        agents={agent.name: agent for agent in agents},
        poll_interval=poll_interval,
        csrf=Csrf(secret),
    )
    if actor is not None:
        dashboard.actor = actor
    router = APIRouter(dependencies=list(dependencies))
    add_pages(router, dashboard)
    add_actions(router, dashboard)
    return router


def create_app(
    app: App,
    *,
    basic_auth: BasicAuth | None = None,
    read_only: bool = False,
    trace_url: str | None = None,
    agents: Iterable[Agent] = (),
    poll_interval: timedelta = timedelta(seconds=2),
) -> FastAPI:
    """A standalone dashboard app. Guarded by ``basic_auth``, or by ``DT_WEB_USER`` and
    ``DT_WEB_PASSWORD`` when both are set; unguarded otherwise (serve it on loopback only:
    ``durable-tasks web`` refuses anything else without auth)."""
    auth = basic_auth or BasicAuth.from_env()
    dependencies = [Depends(auth.dependency())] if auth else []
    web = FastAPI(title="durable_tasks", docs_url=None, redoc_url=None, openapi_url=None)
    web.state.dt_authenticated = auth is not None
    web.include_router(
        create_router(
            app,
            dependencies=dependencies,
            read_only=read_only,
            trace_url=trace_url,
            agents=agents,
            poll_interval=poll_interval,
        )
    )
    return web
