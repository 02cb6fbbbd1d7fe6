"""A submitter process: ``python -m tests.chaos.submitter --prefix K --count N [--start-at T]``.

Submits ``chaos.judge`` jobs under the idempotency keys ``K-0`` … ``K-<N-1>`` (retrying each
with the same key until accepted) and logs every attempt to the history directory named by
``DT_CHAOS_HISTORY_DIR``. Several of these running at once race on the same keys; the
runtime must resolve each key to one task. Database and namespace come from ``DT_*``.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from .app import TASK_NAME, Job, build_app
from .harness import submit_job
from .history import HistoryWriter

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--start-at", type=float, default=0.0, help="wall-clock time to start at (a barrier)")
    parser.add_argument("--shuffle-seed", type=int, default=None, help="submit in a shuffled order")
    parser.add_argument("--retry-for", type=float, default=30.0)
    args = parser.parse_args(argv)

    app = build_app()
    task = app.registry[TASK_NAME]
    writer = HistoryWriter(Path(os.environ["DT_CHAOS_HISTORY_DIR"]), "submitter")
    order = list(range(args.count))
    if args.shuffle_seed is not None:
        random.Random(args.shuffle_seed).shuffle(order)
    if (wait := args.start_at - time.time()) > 0:
        time.sleep(wait)
    try:
        for i in order:
            key = f"{args.prefix}-{i}"
            deadline = time.monotonic() + args.retry_for
            while submit_job(app, task, writer, key, Job(sub=i)) is None:
                if time.monotonic() > deadline:
                    return 1
                time.sleep(0.05)
    finally:
        writer.close()
        if app.runtime.store_opened:
            app.runtime.store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
