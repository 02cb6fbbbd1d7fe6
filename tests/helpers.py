"""Small typed helpers shared by tests."""

from __future__ import annotations

from typing import Any

from durable_tasks import App
from durable_tasks.transport.keys import QueueKeys


def keys(app: App, queue: str = "jobs") -> QueueKeys:
    """The Redis keys of ``queue`` in the app's namespace."""
    return QueueKeys(app.settings.namespace, queue)


async def entries(app: App, stream: str) -> list[tuple[str, dict[str, str]]]:
    """Every entry of ``stream`` as (id, fields)."""
    raw: Any = await app.transport().client.xrange(stream)
    return [(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for i, f in raw or []]
