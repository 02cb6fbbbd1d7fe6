"""An unpaced prune alone, in this process: how fast the store deletes a history, no worker beside.

    python -m benchmarks.profile_prune [--rows 300000] [--batch 1000] [--history-ids time|random]

Fills a fresh schema with ROWS finished tasks (with their attempt and outbox rows, made by SQL:
scale_fill.py) on ``DT_BENCH_DATABASE_URL`` (PostgreSQL by default; SQLite or MySQL/MariaDB
too), then prunes them all with ``App.prune(paced=False)`` and prints the tasks deleted a
second. Run it from two trees, alternating, to compare a change to the prune's statements
(``bench_scale --cases retention`` measures the paced prune beside a drain).
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from benchmarks.bench_dt import bench_app
from benchmarks.scale_fill import fill_history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=1000, help="rows per prune transaction")
    ap.add_argument("--history-ids", choices=("time", "random"), default="time")
    a = ap.parse_args()
    with bench_app() as (app, _db, ns):
        filled = fill_history(app, ns, a.rows, random_ids=a.history_ids == "random")
        began = time.perf_counter()
        report = app.prune(timedelta(days=7), batch=a.batch, max_batches=a.rows // a.batch + 2, paced=False)
        took = time.perf_counter() - began
    print(
        f"{app.engine.dialect.name}: filled {a.rows:,} in {filled:.1f} s; pruned {report.tasks:,} tasks "
        f"in {report.batches} batches, {took:.1f} s = {report.tasks / took:,.0f} tasks/s"
    )


if __name__ == "__main__":
    main()
