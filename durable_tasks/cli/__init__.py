"""The ``durable-tasks`` command: schema, runtime processes, status, operator actions.

The Typer app lives in :mod:`.base`; each module here adds one group of commands to it
(:mod:`.migrate`: the schema's versions).
"""

from __future__ import annotations

from . import approvals, inspect, limits, maintain, migrate, schedule, serve, tasks, web
from .base import cli, load_app

__all__ = ["cli", "load_app", "main"]

# imported for the commands they register
_COMMAND_MODULES = (approvals, inspect, limits, maintain, migrate, schedule, serve, tasks, web)


def main() -> None:
    """Entry point of the ``durable-tasks`` script."""
    cli()
