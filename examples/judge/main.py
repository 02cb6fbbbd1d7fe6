"""Module-level objects for the command line.

    python -m examples.judge.main init-db           # create tables, seed the problems
    durable-tasks run examples.judge.main:app       # dispatcher + worker + reaper
    uvicorn examples.judge.main:api                 # the HTTP API

Importing this module connects to nothing: the engine and Redis are created on first use.
Configure with ``DT_*`` environment variables (``DT_DATABASE_URL``, ``DT_REDIS_URL``, ...).
"""

from __future__ import annotations

import os
import sys

from .api import create_api
from .app import build_app, init_db

if os.environ.get("DT_DEMO_TRACE"):  # the demo's --trace: every process exports its spans
    from ..tracing import install_file_exporter

    install_file_exporter(os.environ["DT_DEMO_TRACE"], f"judge-{os.getpid()}")

__all__ = ["api", "app"]

app = build_app()
api = create_api(app)


def main(argv: list[str]) -> int:
    """``init-db``: create the runtime's and the judge's tables and seed the shipped problems."""
    if argv != ["init-db"]:
        print("usage: python -m examples.judge.main init-db", file=sys.stderr)
        return 2
    added = init_db(app)
    print(f"tables ready; {added} problem(s) added")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
