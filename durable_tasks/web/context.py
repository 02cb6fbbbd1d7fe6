"""What every route of one dashboard shares: the App, its options, templates, CSRF, the overview."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from anyio import to_thread
from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from .. import readmodel
from ..app import App
from ..errors import InvalidQueryError
from .live import Live
from .overview import Overview
from .render import create_templates
from .security import Csrf

if TYPE_CHECKING:
    from ..agents import Agent

__all__ = ["Dashboard", "parse_time"]

#: Sent with every page: scripts only from the dashboard's own files (no inline script runs,
#: so markup that slipped through escaping could not execute), no framing, forms post home.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


#: How long the search form's list of task names is reused.
NAMES_TTL_S = 30.0


def _anonymous(request: Request) -> str:
    return str(getattr(request.state, "dt_actor", None) or "anonymous")


@dataclass
class Dashboard:
    """One dashboard over one App."""

    app: App
    read_only: bool = False
    trace_url: str | None = None
    agents: Mapping[str, Agent] = field(default_factory=dict)
    actor: Callable[[Request], str] = _anonymous
    poll_interval: timedelta = timedelta(seconds=2)
    csrf: Csrf = field(default_factory=Csrf)
    templates: Jinja2Templates = field(default_factory=create_templates)

    def __post_init__(self) -> None:
        self.overview = Overview(self.app)
        self.live = Live(self.app, self.overview, poll_interval=self.poll_interval)
        self._names: tuple[float, list[str]] = (-NAMES_TTL_S, [])

    async def task_names(self) -> list[str]:
        """The task names the search offers (read again at most every ``NAMES_TTL_S``)."""
        at, names = self._names
        if time.monotonic() - at >= NAMES_TTL_S:
            names = await to_thread.run_sync(lambda: readmodel.task_names(self.engine, self.namespace))
            self._names = (time.monotonic(), names)
        return names

    @property
    def engine(self) -> sa.Engine:
        """Reads: the App's read engine, planning keyed on PostgreSQL."""
        return self.app.runtime.store.read_engine

    @property
    def namespace(self) -> str:
        """The App's namespace."""
        return self.app.settings.namespace

    def who(self, request: Request) -> str:
        """Who acts, for the audit log: the user, and the address they came from."""
        client = request.client.host if request.client else "?"
        return f"{self.actor(request)}@{client}"

    def trace_link(self, trace_id: str | None) -> str | None:
        """The trace UI's URL for a trace id, from the configured template."""
        if not trace_id or not self.trace_url:
            return None
        return self.trace_url.replace("{trace_id}", trace_id)

    def context(self, request: Request, values: Mapping[str, Any]) -> dict[str, Any]:
        """What every template receives besides its own values."""
        return {
            "request": request,
            "base": str(request.url_for("dt_overview")),  # row links: one lookup per page, not per row
            "read_only": self.read_only,
            "namespace": self.namespace,
            "csrf_token": self.csrf.token(request),
            "now": datetime.now(UTC),
            "notice": self.csrf.opened(request.query_params.get("notice"), request.query_params.get("seal")),
            "has_agents": bool(self.agents) or self._agents_in_use(),
            **values,
        }

    def _agents_in_use(self) -> bool:
        # The agent tables are always there (the migrations make them); the module is imported
        # only by applications that run agents.
        return "durable_tasks.agents" in sys.modules

    def render(self, request: Request, name: str, values: Mapping[str, Any], status: int = 200) -> HTMLResponse:
        """A page, with its CSRF cookie and security headers."""
        response = self.templates.TemplateResponse(request, name, self.context(request, values), status_code=status)
        self.csrf.token(request, response)  # sets the cookie the token was made from, if new
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        return response

    def fragment(self, request: Request, name: str, values: Mapping[str, Any]) -> str:
        """A template rendered to text (the live overview's SSE events)."""
        return self.templates.get_template(name).render(self.context(request, values))


def parse_time(value: str | None) -> datetime | None:
    """A time from a form (``datetime-local``, ISO 8601): naive means UTC; empty means none."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(400, f"{value[:40]!r} is not a time (YYYY-MM-DDTHH:MM)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def bad_query(exc: InvalidQueryError) -> HTTPException:
    """A read-model refusal as a 400 with its one-line message."""
    return HTTPException(400, str(exc))
