"""Profile one worker draining pre-dispatched no-op tasks, in this process.

    python -m benchmarks.profile_drain [--n 10000] [--concurrency 1000] [--profile out.txt]

Submits and dispatches N tasks (fresh schema and namespace, like bench_dt), then runs one
Worker until all are settled and prints the rate, the process CPU per task, and how long the
claim and group-commit transactions took (wall and their own thread's CPU). With --profile,
pyinstrument samples the event loop thread and writes its text report (the database calls
run in worker threads: their share shows up in the claim/commit lines, not in the report).
This is the harness the optimizations in docs/performance.md were measured with.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from functools import wraps
from typing import Any

import anyio

from benchmarks.bench_dt import bench_app, dispatch_all, submit_many
from durable_tasks.store import execution, results
from durable_tasks.worker import Worker

#: name -> [(items, wall s, thread CPU s)] per call
CALLS: dict[str, list[tuple[int, float, float]]] = defaultdict(list)


def timed(module: Any, name: str, items: Callable[[tuple[Any, ...]], int]) -> None:
    """Wrap ``module.name`` to record each call's size, wall time and its thread's CPU."""
    fn = getattr(module, name)

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            CALLS[name].append((items(args), time.perf_counter() - wall, time.thread_time() - cpu))

    setattr(module, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--profile", help="write a pyinstrument text report here")
    args = ap.parse_args()
    timed(execution, "claim_batch", lambda a: len(a[2]))
    timed(results, "commit_results", lambda a: len(a[1]))
    with bench_app(batch_size=500) as (app, _db, _ns):
        submit_many(app, args.n)
        anyio.run(dispatch_all, app)
        worker = Worker(app, concurrency=args.concurrency)

        async def drain() -> int:
            return await worker.run(max_tasks=args.n)

        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
        wall, cpu = time.perf_counter(), time.process_time()
        done = anyio.run(drain)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if profiler is not None:
            profiler.stop()
            with open(args.profile, "w", encoding="utf-8") as out:
                out.write(profiler.output_text(unicode=False))
    print(f"drained {done} in {wall:.2f} s = {done / wall:,.0f} tasks/s; process CPU {cpu / done * 1e6:.0f} us/task")
    for name, calls in CALLS.items():
        items = sum(c[0] for c in calls)
        print(
            f"{name}: {len(calls)} calls, {items / len(calls):.1f} items each, "
            f"{sum(c[1] for c in calls) / len(calls) * 1e3:.2f} ms wall and "
            f"{sum(c[2] for c in calls) / len(calls) * 1e3:.2f} ms thread CPU per call"
        )


if __name__ == "__main__":
    main()
