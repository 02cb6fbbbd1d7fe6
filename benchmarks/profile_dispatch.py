"""Profile the dispatcher in this process: where a pass's time goes, in bulk and one row at a time.

    python -m benchmarks.profile_dispatch [--n 20000] [--batch 500] [--setup-sql "ALTER TABLE ..."]...
    python -m benchmarks.profile_dispatch --one-row 400

Bulk (the default): submits N tasks (fresh schema and namespace, like bench_dt), then runs
dispatch passes of ``--batch`` rows until the outbox is empty and prints the rate, the process
CPU per row, the local Postgres and Redis CPU per row, and the wall time and thread CPU per row
of each stage: the lease statement (``PostgresStore.lease_outbox``), the enqueue script
(``RedisStreamsTransport.publish``) and the mark-SENT (``PostgresStore.settle_outbox``). On
PostgreSQL the statements run on the event loop's own connections, so a stage's "thread CPU"
is the loop thread's while it waited: exact for --one-row (one pass at a time), an upper
bound in bulk (two passes overlap).

``--one-row K``: K passes that each find ONE new row (submit one task, dispatch it), the shape
of a pass at a low submit rate; prints the wall time and CPU per pass, the event loop thread's
share, and each stage's wall time and thread CPU. This is the fixed cost a task pays on the
latency path. Passes run one at a time (``App.dispatch_once``), without the NOTIFY wait.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

import anyio
from sqlmodel import Session

from benchmarks.bench_dt import bench_app, dispatch_all, submit_many
from benchmarks.proc_cpu import machine_busy, server_cpu, server_cpu_since
from benchmarks.profile_drain import CALLS, timed
from durable_tasks.store.postgres import PostgresStore
from durable_tasks.transport.streams import RedisStreamsTransport

#: publish: [(rows, wall s)] per call (it runs on the event loop: its thread CPU is the loop's)
PUBLISHES: dict[str, list[tuple[int, float]]] = defaultdict(list)


def timed_publish() -> None:
    publish: Callable[..., Awaitable[Any]] = RedisStreamsTransport.publish

    @wraps(publish)
    async def wrapper(self: RedisStreamsTransport, messages: Any, *args: Any, **kwargs: Any) -> Any:
        wall = time.perf_counter()
        try:
            return await publish(self, messages, *args, **kwargs)
        finally:
            PUBLISHES["publish"].append((len(messages), time.perf_counter() - wall))

    RedisStreamsTransport.publish = wrapper  # type: ignore[method-assign]


def stage_lines(per: str, count: int) -> list[str]:
    """Each stage's wall time and thread CPU, per row (bulk) or per pass (one row)."""
    lines = []
    for name, calls in CALLS.items():
        lines.append(
            f"{name}: {len(calls)} calls, {sum(c[1] for c in calls) / count * 1e6:.0f} us wall and "
            f"{sum(c[2] for c in calls) / count * 1e6:.0f} us thread CPU per {per}"
        )
    for name, pubs in PUBLISHES.items():
        lines.append(f"{name}: {len(pubs)} calls, {sum(p[1] for p in pubs) / count * 1e6:.0f} us wall per {per}")
    return lines


def bulk(n: int, batch: int, setup_sql: list[str]) -> None:
    with bench_app(batch_size=batch, publish_on_commit=False) as (app, _db, _ns):
        with app.engine.begin() as conn:
            for statement in setup_sql:
                conn.exec_driver_sql(statement)
        submit_many(app, n)

        async def measured() -> tuple[int, float, float, tuple[float, float], dict[tuple[str, str], float]]:
            # the first pass opens the loop's connections, loads the scripts and prepares the
            # statements: not measured (the same loop keeps them for the measured passes)
            warm = await app.dispatch_once()
            CALLS.clear()
            PUBLISHES.clear()
            servers, machine = server_cpu(), machine_busy()
            wall, cpu = time.perf_counter(), time.process_time()
            await dispatch_all(app)
            return warm, time.perf_counter() - wall, time.process_time() - cpu, machine, servers

        warm, wall, cpu, (busy_before, total_before), servers = anyio.run(measured)
        sent = n - warm
        busy_after, total_after = machine_busy()
        servers_used = server_cpu_since(servers)
    print(f"dispatched {sent} rows in {wall:.2f} s = {sent / wall:,.0f} rows/s; CPU {cpu / sent * 1e6:.1f} us/row")
    print(f"machine: {(busy_after - busy_before) / (total_after - total_before):.0%} of the cores busy")
    for name, used in sorted(servers_used.items()):
        if used > 0:
            print(f"{name} processes: CPU {used / sent * 1e6:.1f} us/row")
    print("\n".join(stage_lines("row", sent)))


def one_row(passes: int) -> None:
    with bench_app(publish_on_commit=False) as (app, _db, _ns):

        async def run() -> tuple[float, float, float]:
            wall = cpu = loop_cpu = 0.0
            for i in range(passes + 1):
                with Session(app.engine) as s:
                    app.submit(s, "bench.noop", i)
                    s.commit()
                if i == 0:  # warm-up pass: connections, scripts, prepared statements
                    await app.dispatch_once()
                    CALLS.clear()
                    PUBLISHES.clear()
                    continue
                w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
                handled = await app.dispatch_once()
                wall += time.perf_counter() - w
                cpu += time.process_time() - c
                loop_cpu += time.thread_time() - t
                assert handled == 1, handled
            return wall, cpu, loop_cpu

        wall, cpu, loop_cpu = anyio.run(run)
    print(
        f"{passes} one-row passes: {wall / passes * 1e3:.2f} ms wall and {cpu / passes * 1e3:.2f} ms process CPU "
        f"per pass ({loop_cpu / passes * 1e3:.2f} ms on the event loop thread)"
    )
    print("\n".join(stage_lines("pass", passes)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="rows to dispatch (bulk)")
    ap.add_argument("--batch", type=int, default=500, help="rows per pass (bulk; the runtime's default: 500)")
    ap.add_argument("--one-row", type=int, metavar="K", help="K passes of one row each instead of the bulk run")
    ap.add_argument(
        "--setup-sql", action="append", default=[], help="bulk: run this SQL after the schema exists (A/B trials)"
    )
    args = ap.parse_args()
    timed(PostgresStore, "lease_outbox", lambda a: 1)
    timed(PostgresStore, "settle_outbox", lambda a: 1)
    timed_publish()
    if args.one_row:
        one_row(args.one_row)
    else:
        bulk(args.n, args.batch, args.setup_sql)


if __name__ == "__main__":
    main()
