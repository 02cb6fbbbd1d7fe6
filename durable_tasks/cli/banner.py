"""The lines a runtime process prints once its servers answered: what it runs, against what.

An operator reading a deploy's first lines sees the database and Redis it reached (passwords
masked by :func:`~durable_tasks.urls.safe_url`), the namespace, the queues it serves, the tasks
it knows and how many run at once, as Celery's and Dramatiq's workers show theirs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from ..app import App
from ..urls import safe_url

__all__ = ["banner"]


def _version() -> str:
    try:
        return version("durable-tasks")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "?"


def banner(app: App, roles: Sequence[str], *, queues: Sequence[str] | None = None) -> list[str]:
    """The banner's lines: ``roles`` are the components this process runs (``worker``,
    ``dispatcher``…); ``queues`` those its worker reads (None: every registered queue)."""
    s = app.settings
    tasks = sorted(app.runtime.registry.values(), key=lambda t: (t.queue, t.name))
    served = list(queues) if queues else app.runtime.queues()
    lines = [
        f"durable_tasks {_version()} · {', '.join(roles)} · pid {os.getpid()}",
        f"  database     {safe_url(app.engine.url.render_as_string(hide_password=False))}",
        f"  redis        {safe_url(app.redis_url)}",
        f"  namespace    {s.namespace}",
        f"  queues       {', '.join(served) or '(none: no task is registered)'}",
        f"  tasks        {', '.join(f'{t.name} ({t.queue})' for t in tasks) or '(none)'}",
    ]
    if "worker" in roles:
        grace, mib = s.shutdown_grace.total_seconds(), s.payload_memory / 2**20
        threads = "" if s.handler_threads is None else f"; sync-handler threads {s.handler_threads}"
        lines.append(
            f"  concurrency  {s.concurrency} (shutdown grace {grace:g} s; payloads over 64 KiB {mib:g} MiB{threads})"
        )
    if "scheduler" in roles:
        lines.append(f"  schedules    {', '.join(sorted(app.schedules)) or '(none)'}")
    return lines
