"""What one task's three transactions cost the store, one at a time, on any database.

    python -m benchmarks.profile_store [--n 300] [--gap 0.05]      # DT_BENCH_DATABASE_URL picks the database

On a fresh schema and namespace (like bench_dt), N times: a submit and its commit (the caller's
``Session``, no publish at commit), then the store's claim of that task (what a worker calls,
one delivery), then the fenced commit of its result (one write), a millisecond apart, and
``--gap`` seconds before the next task. Prints the median wall time and process CPU of each
call. The process runs nothing else, so its CPU is the call's, whichever thread ran it (SQLite's
and MySQL's stores run a transaction on a worker thread, PostgreSQL's claim on the loop's own
connection). One call at a time, with a gap, is the shape of the latency path at a low rate,
where each hop wakes a process that slept; a drain amortizes the same statements over batches.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import Any

import anyio
from sqlmodel import Session

from benchmarks.bench_dt import bench_app
from durable_tasks import App
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.store.results import FinalWrite

LEASE = timedelta(seconds=30)
KINDS = ("submit + commit", "claim", "result commit")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="tasks, each submitted, claimed and committed")
    ap.add_argument("--gap", type=float, default=0.05, help="seconds between one task's commit and the next submit")
    a = ap.parse_args(argv)
    with bench_app(publish_on_commit=False) as (app, _db, ns):
        wall, cpu = anyio.run(each_task, app, ns, a.n, a.gap)
        dialect = app.engine.dialect.name
    warm = a.n // 10  # the first calls open connections and fill statement caches
    print(f"{dialect}: one task at a time, {a.gap * 1000:g} ms apart, medians of {a.n - warm} calls (ms)")
    print(f"  {'':<18} {'wall':>8} {'CPU':>8}")
    for kind in KINDS:
        print(f"  {kind:<18} {median_ms(wall[kind][warm:]):8.3f} {median_ms(cpu[kind][warm:]):8.3f}")


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def each_task(app: App, ns: str, n: int, gap: float) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    store = app.runtime.store
    wall: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}

    async def timed(kind: str, call: Callable[[], Awaitable[Any]]) -> Any:
        started, used = time.perf_counter(), time.process_time()
        out = await call()
        wall[kind].append(time.perf_counter() - started)
        cpu[kind].append(time.process_time() - used)
        return out

    async def submit(i: int) -> str:
        with Session(app.engine) as s:
            handle = app.submit(s, "bench.noop", i)
            s.commit()
        return handle.id

    for i in range(n):
        task_id = await timed("submit + commit", partial(submit, i))
        await anyio.sleep(0.001)
        request = [ClaimRequest(task_id, 0, 0)]
        claim = partial(store.claim_executions, ns, request, worker_id="profile", now=app.clock(), lease=LEASE)
        [claimed] = await timed("claim", claim)
        assert isinstance(claimed, ExecutionClaim), claimed
        await anyio.sleep(0.001)
        await timed("result commit", partial(store.commit_results, [FinalWrite(claimed, "1")], now=app.clock()))
        await anyio.sleep(gap)
    return wall, cpu


if __name__ == "__main__":
    main()
