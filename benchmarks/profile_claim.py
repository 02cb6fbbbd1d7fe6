"""Where a worker's claim spends its time on the latency path, one delivery at a time.

    python -m benchmarks.profile_claim [--n 300] [--gap 0.005] [--cpu]

Submits ``4 x N`` tasks (fresh schema and namespace, like bench_dt; PostgreSQL only) and claims
them one at a time on the worker's own connections, rotating through four kinds of call so that
each sees the same machine: a bare ``SELECT 1`` (the round trip), the store's claim
(``PostgresStore.claim_executions``: what the worker calls), its one statement alone, and the same
statement committed without waiting for the WAL flush (``synchronous_commit = off``, which the
runtime does NOT do: the fences rest on the claim). Prints the median wall time of each and the
server's own time for the statement (``EXPLAIN ANALYZE`` of one more claim). The difference
between the store's claim and the round trip is what a claim adds to submit->start; the one
without the flush shows how little of it the flush is. With ``--cpu`` each call is timed by the
event loop thread's CPU instead: what a statement costs the worker's interpreter (psycopg, the
loop, the store's wrapper), which a task at a low rate pays whole, sharing it with no other task.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import timedelta
from typing import Any

import anyio
import sqlalchemy as sa

from benchmarks.bench_dt import bench_app, submit_many
from durable_tasks.clock import system_clock
from durable_tasks.records import tasks_table
from durable_tasks.store.execution import ClaimRequest
from durable_tasks.store.postgres import PostgresStore, statements

LEASE = timedelta(seconds=30)
#: The claim statement's WHERE gains this to commit without waiting for the WAL flush (the
#: dispatcher's mark-SENT does the same: durable_tasks/store/sql/postgres.sql).
NO_FLUSH = "      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'\n), claimed AS ("
#: Where that goes: the end of the statement's ``claimable`` CTE.
AFTER_CLAIMABLE = "), claimed AS ("
KINDS = ("SELECT 1", "store claim", "claim statement", "claim statement, no WAL flush wait")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="claims of each kind")
    ap.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds to sleep before each call (0.005: a claim every 5 ms, as at 200/s)",
    )
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="time each call by the event loop thread's CPU (time.thread_time) instead of the wall clock: "
        "what a claim costs the worker's own process",
    )
    a = ap.parse_args(argv)
    with bench_app(publish_on_commit=False) as (app, _db, ns):
        store = app.runtime.store
        if not isinstance(store, PostgresStore):
            raise SystemExit("profile_claim measures PostgreSQL's claim: set DT_BENCH_DATABASE_URL to a PostgreSQL URL")
        submit_many(app, len(KINDS) * a.n + 1)
        t = tasks_table.c
        with app.engine.connect() as conn:
            keys = conn.execute(sa.select(t.id, t.generation, t.delivery).where(t.namespace == ns).order_by(t.id)).all()
        clock = time.thread_time if a.cpu else time.perf_counter
        times = anyio.run(claim_each, store, ns, [ClaimRequest(*k) for k in keys], a.n, a.gap, clock)
    warm = a.n // 10  # the first claims open connections and prepare the statement
    print(f"one delivery per claim, medians of {a.n - warm} calls each (ms of {'CPU' if a.cpu else 'wall'} time):")
    for kind in KINDS:
        print(f"  {kind:<40} {statistics.median(times[kind][warm:]) * 1000:7.3f}")


async def claim_each(
    store: PostgresStore, ns: str, requests: list[ClaimRequest], n: int, gap: float, clock: Callable[[], float]
) -> dict[str, list[float]]:
    conns = store.connections
    select_1 = statements.OneStatement("SELECT 1", {}, lambda rows: rows)

    def statement(request: ClaimRequest) -> statements.OneStatement[Any]:
        return statements.claim_executions(ns, [request], worker_id="profile", now=system_clock(), lease=LEASE)

    def no_flush(request: ClaimRequest) -> statements.OneStatement[Any]:
        claim = statement(request)
        if AFTER_CLAIMABLE not in claim.sql:  # else this kind would time the flushed claim again
            raise SystemExit("the claim statement changed: profile_claim cannot place its no-flush clause")
        return replace(claim, sql=claim.sql.replace(AFTER_CLAIMABLE, NO_FLUSH, 1))

    calls: dict[str, Callable[[ClaimRequest], Coroutine[Any, Any, Any]]] = {
        KINDS[0]: lambda _: conns.run(select_1),
        KINDS[1]: lambda r: store.claim_executions(ns, [r], worker_id="profile", now=system_clock(), lease=LEASE),
        KINDS[2]: lambda r: conns.run(statement(r)),
        KINDS[3]: lambda r: conns.run(no_flush(r)),
    }
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    pending = iter(requests)
    for _ in range(n):
        for kind, call in calls.items():
            if gap:
                await anyio.sleep(gap)
            began = clock()
            await call(next(pending))
            times[kind].append(clock() - began)
    last = statement(next(pending))
    plan = await conns.run(replace(last, sql="EXPLAIN (ANALYZE, TIMING OFF) " + last.sql, read=lambda rows: rows))
    server = [row[0] for row in plan if "Execution Time" in row[0] or "Planning Time" in row[0]]
    print("the claim statement on the server (EXPLAIN ANALYZE, one claim):", "; ".join(server))
    return times


if __name__ == "__main__":
    main()
