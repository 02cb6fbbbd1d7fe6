"""Templates and the filters they use. Jinja's autoescaping is on for every template: a payload,
result, error or name is shown as text, whatever it contains."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates

__all__ = ["STATIC_DIR", "STATIC_FILES", "create_templates"]

#: What a missing value shows as (an en dash).
NONE = "\u2013"

WEB_DIR = Path(__file__).parent
STATIC_DIR = WEB_DIR / "static"
#: The files the router serves, and their media types (nothing else under static/ is served).
STATIC_FILES = {
    "app.css": "text/css",
    "app.js": "text/javascript",
    "vendor/htmx.min.js": "text/javascript",
    "vendor/htmx-ext-sse.min.js": "text/javascript",
    "vendor/uPlot.iife.min.js": "text/javascript",
    "vendor/uPlot.min.css": "text/css",
}


def fmt_age(seconds: float | None) -> str:
    """1.2s, 3m 4s, 5h 6m, 7d 8h."""
    if seconds is None:
        return NONE
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60}m"
    return f"{s // 86400}d {(s % 86400) // 3600}h"


def fmt_ms(value: float | None) -> str:
    """Milliseconds, or seconds past 10 s."""
    if value is None:
        return NONE
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def fmt_dt(value: datetime | None) -> str:
    """UTC, to the millisecond."""
    if value is None:
        return NONE
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(sep=" ", timespec="milliseconds")[:23]


def fmt_since(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago (negative: how long until)."""
    if value is None:
        return NONE
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = ((now or datetime.now(UTC)) - value).total_seconds()
    return f"{fmt_age(delta)} ago" if delta >= 0 else f"in {fmt_age(-delta)}"


def fmt_rate(value: float | None) -> str:
    """A fraction as a percentage."""
    return NONE if value is None else f"{value * 100:.1f}%"


def fmt_count(value: int, cap: int) -> str:
    """A capped count: past the cap, "10,000+"."""
    return f"{cap:,}+" if value > cap else f"{value:,}"


def pretty_json(text: str | None) -> str:
    """Stored JSON indented for reading; text that is not JSON as it is."""
    if text is None:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except ValueError:
        return text


def create_templates() -> Jinja2Templates:
    """The dashboard's templates with its filters."""
    templates = Jinja2Templates(directory=WEB_DIR / "templates")
    env = templates.env
    env.autoescape = True  # every template, whatever its file name
    filters: dict[str, Any] = {
        "age": fmt_age,
        "ms": fmt_ms,
        "dt": fmt_dt,
        "since": fmt_since,
        "rate": fmt_rate,
        "count": fmt_count,
        "pretty_json": pretty_json,
    }
    env.filters.update(filters)
    return templates
