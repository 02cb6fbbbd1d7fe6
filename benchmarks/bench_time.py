"""Time features, measured: periodic schedulers racing, delayed-task lateness, the cost of
many delayed rows, batch submit, result waits.

    python -m benchmarks.bench_time lateness [--n 200] [--delay 2] [--rate 20]
        N tasks submitted with delay=D at R per second, a warm dispatcher and worker (one process
        each): start lateness = handler start - (submit time + D), its distribution, and how
        many started early (must be none)
    python -m benchmarks.bench_time delayed-index [--rows 100000] [--due 500]
        ROWS rows due in three days beside DUE due now: the claim's selection and the next-due
        probe (EXPLAIN ANALYZE: index, entries read, rows removed by a filter, buffers, time),
        and an empty dispatch pass, against the same outbox without the delayed rows
    python -m benchmarks.bench_time submit-many [--n 10000] [--batch 100]
        N tasks in transactions of BATCH: submit() per task vs submit_many() per transaction
        (tasks/s, statements per transaction)
    python -m benchmarks.bench_time waits [--n 1000]
        N tasks submitted, N async waits started, then a dispatcher and a worker (another
        process): database reads per wait on the waiting process, and wake-up latency
        (result commit -> wait returned) p50/p99
    python -m benchmarks.bench_time schedulers [--schedulers 3] [--seconds 60]
        S scheduler processes run one every-second schedule for the window: ticks submitted,
        missed (a gap between the first and the last), submitted twice (submit calls beyond one
        per tick), and each tick's submit lateness (task created_at - tick) p50/p99/max

Prints one JSON object per line (benchmarks/bench_dt.py's format). Postgres and Redis come from
DT_BENCH_DATABASE_URL / DT_BENCH_REDIS_URL; each run uses its own schema and namespace.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa
from sqlmodel import Session

from benchmarks.bench_dt import REDIS, Children, bench_app, build, pct, record, schema, seconds, wait_count
from durable_tasks import App, TaskContext, TaskHandle
from durable_tasks.periodic import Schedule
from durable_tasks.records import tasks_table
from durable_tasks.scheduler import Scheduler
from durable_tasks.store import sql
from durable_tasks.store.payloads import INLINE_PAYLOAD_BYTES
from durable_tasks.valkey_keeper import die_with_parent

t = tasks_table.c

EVERY_SECOND = Schedule.interval("bench-every-second", "bench.tick", timedelta(seconds=1))


def tick_app(db: str, namespace: str) -> App:
    app = build(db, namespace, REDIS)

    @app.task(name="bench.tick", queue="bench")
    async def tick(ctx: TaskContext[datetime], at: datetime) -> None:
        return None

    return app


def scheduler_child(db: str, namespace: str, seconds: float) -> None:
    """One scheduler process: runs the schedule for ``seconds``, prints its submit counts."""
    app = tick_app(db, namespace)
    scheduler = Scheduler(app, {EVERY_SECOND.name: EVERY_SECOND})

    async def go() -> None:
        with anyio.move_on_after(seconds):
            await scheduler.run()
        await app.aclose()

    anyio.run(go)
    print(json.dumps({"submitted": scheduler.submitted, "created": scheduler.created}), flush=True)


def schedulers(count: int, seconds: float) -> None:
    with schema() as db:
        namespace = f"bench{uuid.uuid4().hex[:6]}"
        app = tick_app(db, namespace)
        app.create_all()
        children = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.bench_time", "scheduler-child", db, namespace, str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
            for _ in range(count)
        ]
        reports = [
            json.loads(child.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1]) for child in children
        ]
        with app.engine.connect() as conn:
            rows = conn.execute(sa.select(t.idempotency_key, t.created_at).where(t.namespace == namespace)).all()
        app.engine.dispose()
    ticks = sorted(
        (datetime.strptime(key.split("@")[1], "%Y-%m-%dT%H:%M:%S%z"), _aware(created)) for key, created in rows
    )
    first, last = ticks[0][0], ticks[-1][0]
    expected = int((last - first).total_seconds()) + 1
    late_ms = [(created - tick).total_seconds() * 1000 for tick, created in ticks]
    submitted = sum(r["submitted"] for r in reports)
    record(
        "schedulers",
        len(ticks),
        "ticks",
        schedulers=count,
        window_s=seconds,
        missed=expected - len(ticks),
        submitted_twice=submitted - len(ticks),
        per_scheduler=[r["submitted"] for r in reports],
        lateness_ms_p50=round(statistics.median(late_ms), 2),
        lateness_ms_p99=round(pct(late_ms, 99), 2),
        lateness_ms_max=round(max(late_ms), 2),
    )


def distribution(name: str, values_ms: list[float], **extra: Any) -> None:
    record(
        name,
        round(statistics.median(values_ms), 2),
        "ms",
        p90=round(pct(values_ms, 90), 2),
        p99=round(pct(values_ms, 99), 2),
        min=round(min(values_ms), 2),
        max=round(max(values_ms), 2),
        n=len(values_ms),
        **extra,
    )


def lateness(n: int, delay_s: float, rate: float) -> None:
    delay = timedelta(seconds=delay_s)
    with bench_app() as (app, db, ns), Children(db, ns, DT_BENCH_CONC="16") as kids:
        kids.spawn("worker")
        kids.spawn("dispatcher")
        kids.wait_ready()
        kids.go()
        with Session(app.engine) as s:  # warm-up: connections and imports
            app.submit(s, "bench.stamp", -1.0)
            s.commit()
        wait_count(app, ns, 1, 60)
        handles: list[TaskHandle] = []
        t0 = time.perf_counter()
        for i in range(n):
            if (pause := t0 + i / rate - time.perf_counter()) > 0:
                time.sleep(pause)
            with Session(app.engine) as s:
                handles.append(app.submit(s, "bench.stamp", 0.0, delay=delay))
                s.commit()
        done = wait_count(app, ns, n + 1, delay_s + n / rate + 120)
        with app.runtime.store.read_engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.created_at, t.result).where(t.id.in_([h.id for h in handles]), t.result.is_not(None))
            ).all()
    late = [(float(result) - (seconds(created) + delay_s)) * 1000 for created, result in rows]
    distribution(
        f"start lateness, delay={delay_s:g}s",
        late,
        metric="delay_lateness_p50",
        early=sum(1 for ms in late if ms < 0),
        finished=done - 1,
        rate=rate,
    )


@contextmanager
def statements(app: App) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    sa.event.listen(app.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", count)


def submit_many(n: int, batch: int) -> None:
    with bench_app() as (app, _db, _ns):
        noop = app.registry["bench.noop"]
        rates: dict[str, float] = {}
        per_txn: dict[str, int] = {}
        for way in ("submit", "submit_many", "submit", "submit_many"):  # alternated, twice
            started = time.perf_counter()
            for lo in range(0, n, batch):
                with Session(app.engine) as s, statements(app) as seen:
                    s.connection()
                    seen.clear()
                    if way == "submit":
                        for i in range(lo, min(n, lo + batch)):
                            noop.submit(s, i)
                    else:
                        noop.submit_many(s, [(i, None) for i in range(lo, min(n, lo + batch))])
                    per_txn[way] = len(seen)
                    s.commit()
            rates[way] = max(rates.get(way, 0.0), n / (time.perf_counter() - started))
    for way, rate in rates.items():
        record(f"{way} x{batch} per transaction", round(rate), "tasks/s", statements_per_transaction=per_txn[way])
    record("submit_many / submit", round(rates["submit_many"] / rates["submit"], 2), "x", batch=batch)


def delayed_index(rows: int, due: int) -> None:
    for delayed in (0, rows):
        with bench_app() as (app, _db, ns):
            now = app.clock()
            with app.engine.begin() as conn:
                total = delayed + due
                conn.exec_driver_sql(
                    "INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery,"
                    " reclaims, counted_losses, failures, max_attempts, shadow, created_at)"
                    " SELECT 'task-' || g, %(ns)s, 'bench.noop', 'bench', '1', 'PENDING', 0, 0, 0, 0, 0, 0, 1, false,"
                    " %(now)s FROM generate_series(1, %(total)s) AS g",
                    {"ns": ns, "now": now, "total": total},
                )
                conn.exec_driver_sql(
                    "INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts,"
                    " next_attempt_at, shadow, created_at)"
                    " SELECT %(ns)s, 'task-' || g, 'bench', 0, 0, 'PENDING', 0,"
                    " CASE WHEN g <= %(delayed)s THEN %(later)s ELSE %(now)s END, false, %(now)s"
                    " FROM generate_series(1, %(total)s) AS g",
                    {"ns": ns, "now": now, "later": now + timedelta(days=3), "delayed": delayed, "total": total},
                )
                conn.exec_driver_sql("ANALYZE dt_outbox")
                conn.exec_driver_sql("ANALYZE dt_tasks")
            params = {
                "namespaces": [ns],
                "now": now,
                "lease_until": now + timedelta(seconds=30),
                "token": "t",
                "limit": 500,
                "watermark": 0,
                "inline_payload": INLINE_PAYLOAD_BYTES,
            }
            for name in ("claim_outbox", "next_due"):
                with app.engine.connect() as conn, conn.begin():
                    conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # as the runtime's connections
                    (doc,) = conn.exec_driver_sql(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.postgres()[name], params
                    ).scalar_one()
                    conn.rollback()
                scan = next(n for n in _nodes(doc["Plan"]) if n.get("Alias") == "d" and n["Node Type"].endswith("Scan"))
                record(
                    f"{name}: selection with {delayed:,} delayed rows",
                    scan["Actual Total Time"],
                    "ms",
                    index=scan.get("Index Name"),
                    entries_read=scan["Actual Rows"],
                    removed_by_filter=scan.get("Rows Removed by Filter", 0),
                    buffers=scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0),
                    statement_ms=doc["Execution Time"],
                )
            with app.engine.begin() as conn:  # the due rows go: what remains is only waiting
                conn.exec_driver_sql(
                    "DELETE FROM dt_outbox WHERE namespace = %(ns)s AND next_attempt_at <= %(now)s",
                    {"ns": ns, "now": now},
                )

            async def empty_passes(app: App = app) -> list[float]:
                took = []
                for _ in range(200):
                    started = time.perf_counter()
                    assert await app.dispatch_once() == 0
                    await app.runtime.store.next_due(ns, now=app.clock())
                    took.append((time.perf_counter() - started) * 1000)
                await app.aclose()
                return took

            distribution(f"idle dispatcher pass + next-due, {delayed:,} delayed rows", anyio.run(empty_passes))


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def waits(n: int) -> None:
    commit_log = Path(tempfile.mkdtemp(prefix="dt-bench-waits-")) / "result-commits.log"
    with (
        bench_app(result_poll_initial=timedelta(minutes=5)) as (app, db, ns),
        Children(db, ns, DT_BENCH_CONC="16", DT_BENCH_COMMIT_LOG=str(commit_log)) as kids,
    ):
        kids.spawn("worker")
        kids.spawn("dispatcher")
        kids.wait_ready()
        with Session(app.engine) as s:
            handles = app.registry["bench.noop"].submit_many(s, [(i, None) for i in range(n)])
            s.commit()
        returned: dict[str, float] = {}

        async def main() -> int:
            with statements(app) as seen:
                async with anyio.create_task_group() as tg:

                    async def wait(handle: TaskHandle) -> None:
                        await handle.wait(timeout=300)
                        returned[handle.id] = time.time()

                    for handle in handles:
                        tg.start_soon(wait, handle)
                    while app.results.hub().waiting < n:  # noqa: ASYNC110 - a count in another thread
                        await anyio.sleep(0.01)
                    kids.go()
            reads = sum(1 for q in seen if q.lstrip().upper().startswith("SELECT") and "dt_tasks" in q)
            await app.aclose()
            return reads

        reads = anyio.run(main)
    committed: dict[str, float] = {}
    for line in commit_log.read_text().splitlines():
        task_id, at = line.split()
        committed.setdefault(task_id, float(at))
    wake = [(returned[i] - committed[i]) * 1000 for i in returned if i in committed]
    record("result waits: database reads per wait", round(reads / n, 3), "reads", n=n, reads=reads)
    distribution("result waits: result commit -> wait returned", wake)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="case", required=True)
    p = sub.add_parser("schedulers")
    p.add_argument("--schedulers", type=int, default=3)
    p.add_argument("--seconds", type=float, default=60.0)
    child = sub.add_parser("scheduler-child")
    child.add_argument("db")
    child.add_argument("namespace")
    child.add_argument("seconds", type=float)
    p = sub.add_parser("lateness")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--delay", type=float, default=2.0)
    p.add_argument("--rate", type=float, default=20.0)
    p = sub.add_parser("delayed-index")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--due", type=int, default=500)
    p = sub.add_parser("submit-many")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=100)
    p = sub.add_parser("waits")
    p.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    if args.case == "schedulers":
        schedulers(args.schedulers, args.seconds)
    elif args.case == "scheduler-child":
        scheduler_child(args.db, args.namespace, args.seconds)
    elif args.case == "lateness":
        lateness(args.n, args.delay, args.rate)
    elif args.case == "delayed-index":
        delayed_index(args.rows, args.due)
    elif args.case == "submit-many":
        submit_many(args.n, args.batch)
    elif args.case == "waits":
        waits(args.n)


if __name__ == "__main__":
    main()
