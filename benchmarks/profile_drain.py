"""Profile one worker draining pre-dispatched tasks, in this process.

    python -m benchmarks.profile_drain [--n 10000] [--concurrency 1000] [--task noop|readme] [--sleep S]
                                       [--profile out.txt] [--setup-sql "DROP INDEX ..."]...

Submits and dispatches N tasks (fresh schema and namespace, like bench_dt) of one kind
(``noop``: the headline's ``async def`` no-op with an int payload; ``readme``: the README's
``def`` handler, pydantic payload, dict result, benchmarks/readme_app.py), then runs one
Worker until all are settled and prints the rate, the process CPU per task (and the event loop
thread's, with the share of the drain it was busy), how busy the
machine was, the CPU the local Postgres (by role: backend, walwriter, ...) and Redis processes
used per task (read from /proc: the servers share the machine), the WAL PostgreSQL wrote per task,
the HOT updates and the heap bytes per task of dt_tasks, dt_outbox and dt_attempts, and how long
the claim and group-commit transactions took (wall, and the CPU of the thread they ran on:
the loop's on PostgreSQL, where other work interleaves), and the garbage collector's runs per
generation (the worker's collector is tuned as the CLI's is; DT_GC_YOUNG_THRESHOLD=0 keeps
Python's defaults). --setup-sql
runs statements after the schema exists, for A/B trials of schema changes. With --profile,
pyinstrument samples the event loop thread and writes its text report (on PostgreSQL the
claim and commit statements run on the loop's own connections; on SQLite in worker threads).
This is the harness the optimizations in docs/performance.md were measured with.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import os
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from functools import wraps
from typing import Any

import anyio

from benchmarks import readme_app
from benchmarks.bench_dt import bench_app, dispatch_all, submit_many
from benchmarks.proc_cpu import machine_busy, server_cpu, server_cpu_since
from durable_tasks import App, TaskContext
from durable_tasks.process import tune_gc
from durable_tasks.store.postgres import PostgresStore
from durable_tasks.worker import Worker

#: name -> [(items, wall s, thread CPU s)] per call
CALLS: dict[str, list[tuple[int, float, float]]] = defaultdict(list)


def timed(owner: Any, name: str, items: Callable[[tuple[Any, ...]], int]) -> None:
    """Wrap ``owner.name`` (a function, or a coroutine method of a class) to record each call's
    size, wall time and its thread's CPU. A coroutine runs on the event loop thread: its CPU
    then includes whatever else the loop ran meanwhile, so it means something only when calls
    run one at a time (profile_dispatch --one-row)."""
    fn = getattr(owner, name)
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        @wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return await fn(*args, **kwargs)
            finally:
                CALLS[name].append((items(args), time.perf_counter() - wall, time.thread_time() - cpu))

    else:

        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                CALLS[name].append((items(args), time.perf_counter() - wall, time.thread_time() - cpu))

    setattr(owner, name, wrapper)


class CollectorPauses:
    """How often each generation of the garbage collector ran and how long each run took
    (``gc.callbacks``); a run stops the event loop, and every task in flight with it."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = defaultdict(list)
        self._started = 0.0

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._started)

    def report(self) -> None:
        young, older, oldest = gc.get_threshold()
        print(f"garbage collector: thresholds {young}/{older}/{oldest}, {gc.get_freeze_count():,} objects frozen")
        for generation, pauses in sorted(self.pauses.items()):
            print(
                f"  generation {generation}: {len(pauses)} runs, {statistics.median(pauses) * 1e3:.2f} ms median, "
                f"{max(pauses) * 1e3:.2f} ms longest, {sum(pauses) * 1e3:.0f} ms in all"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--task", choices=["noop", "readme"], default="noop")
    ap.add_argument(
        "--sleep", type=float, default=0.0, help="the noop awaits this many seconds (the in-flight case: 1.0)"
    )
    ap.add_argument("--profile", help="write a pyinstrument text report here")
    ap.add_argument(
        "--cprofile",
        type=int,
        metavar="K",
        help="run the event loop under cProfile and print function calls per task and the top K by own time",
    )
    ap.add_argument(
        "--setup-sql", action="append", default=[], help="run this SQL after the schema exists (A/B trials)"
    )
    args = ap.parse_args()
    timed(PostgresStore, "claim_executions", lambda a: len(a[2]))  # (self, namespace, requests)
    timed(PostgresStore, "commit_results", lambda a: len(a[1]))  # (self, writes)
    with bench_app(batch_size=500, concurrency=args.concurrency) as (app, _db, _ns):
        with app.engine.begin() as conn:
            for statement in args.setup_sql:
                conn.exec_driver_sql(statement)
        if args.task == "readme":
            readme_app.register(app)
            submit_many(app, args.n, task=readme_app.TASK, payload=readme_app.request)
        elif args.sleep:

            @app.task(name="bench.sleep", queue="bench")
            async def sleep(ctx: TaskContext[int], n: int) -> int:
                await anyio.sleep(args.sleep)
                return n

            submit_many(app, args.n, task="bench.sleep")
        else:
            submit_many(app, args.n)
        anyio.run(dispatch_all, app)
        worker = Worker(app.runtime)
        tune_gc(app.settings)  # as the CLI's worker at this concurrency (DT_GC_YOUNG_THRESHOLD=0: Python's)

        loop_cpu = [0.0]

        async def drain() -> int:
            began = time.thread_time()  # the event loop's thread: the worker's own code runs on it
            try:
                return await worker.run(max_tasks=args.n)
            finally:
                loop_cpu[0] = time.thread_time() - began

        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
        deterministic = None
        if args.cprofile:
            deterministic = cProfile.Profile()
            deterministic.enable()
        wal_at = wal_position(app)
        servers = server_cpu()
        machine = machine_busy()
        wall, cpu = time.perf_counter(), time.process_time()
        with CollectorPauses() as collector:
            done = anyio.run(drain)
        if deterministic is not None:
            deterministic.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        (busy_after, total_after), (busy_before, total_before) = machine_busy(), machine
        servers_used = server_cpu_since(servers)
        wal_bytes = wal_since(app, wal_at)
        with app.engine.connect() as conn:
            hot = (
                conn.exec_driver_sql(
                    "SELECT relname, n_tup_upd, n_tup_hot_upd, pg_relation_size(relid) FROM pg_stat_user_tables"
                    " WHERE relname IN ('dt_tasks', 'dt_attempts', 'dt_outbox') AND schemaname = current_schema()"
                ).all()
                if app.engine.dialect.name == "postgresql"
                else []
            )
        if profiler is not None:
            profiler.stop()
            with open(args.profile, "w", encoding="utf-8") as out:
                out.write(profiler.output_text(unicode=False))
    print(f"drained {done} in {wall:.2f} s = {done / wall:,.0f} tasks/s; process CPU {cpu / done * 1e6:.0f} us/task")
    print(f"machine: {(busy_after - busy_before) / (total_after - total_before):.0%} of {os.cpu_count()} cores busy")
    print(f"event loop thread: CPU {loop_cpu[0] / done * 1e6:.0f} us/task, busy {loop_cpu[0] / wall:.0%} of the drain")
    if wal_bytes is not None:
        print(f"PostgreSQL WAL: {wal_bytes / done:,.0f} bytes/task (the server's, over the drain)")
    for table, updated, hot_updated, size in hot:
        print(
            f"{table}: {updated} updates, {hot_updated} HOT (cumulative, incl. submit/dispatch);"
            f" {size / done:,.0f} heap bytes/task"
        )
    for name, used in sorted(servers_used.items()):
        print(f"{name} processes: CPU {used / done * 1e6:.0f} us/task ({used / wall:.0%} of a core)")
    collector.report()
    for name, calls in CALLS.items():
        items = sum(c[0] for c in calls)
        print(
            f"{name}: {len(calls)} calls, {items / len(calls):.1f} items each, "
            f"{sum(c[1] for c in calls) / len(calls) * 1e3:.2f} ms wall and "
            f"{sum(c[2] for c in calls) / len(calls) * 1e3:.2f} ms thread CPU per call"
        )
    if deterministic is not None:
        stats = pstats.Stats(deterministic)
        function_calls = sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]
        print(f"event loop thread: {function_calls / done:.0f} Python function calls per task (cProfile)")
        stats.sort_stats("tottime").print_stats(args.cprofile)


def wal_position(app: App) -> str | None:
    """PostgreSQL's current WAL position (None on another database)."""
    if app.engine.dialect.name != "postgresql":
        return None
    with app.engine.connect() as conn:
        return str(conn.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar_one())


def wal_since(app: App, position: str | None) -> int | None:
    """Bytes of WAL the server wrote since ``position``: every writer's, so the drain's alone
    only while nothing else writes to that server (a deterministic measure of what a schema
    change costs each task, where the rate moves with the machine)."""
    if position is None:
        return None
    with app.engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %(at)s::pg_lsn)", {"at": position}
            ).scalar_one()
        )


if __name__ == "__main__":
    main()
