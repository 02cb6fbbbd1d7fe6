"""durable_tasks throughput, latency, overhead and memory, measured the way the peers were.

    python -m benchmarks.bench_dt drain --n 10000 [--workers 1] [--concurrency 200]
        pre-submitted, pre-dispatched no-op tasks; W worker processes (released together);
        rate = N / (last finished_at - first started_at); also the in-process dispatch rate
    python -m benchmarks.bench_dt readme --n 10000
        the README's path: def handler, pydantic payload, dict result, one `durable-tasks
        worker` process at every default setting; rate as in drain, and the worker's CPU per task
        from the first task's start on
    python -m benchmarks.bench_dt dispatch --n 10000 [--dispatchers 1] [--batch 50]
        outbox rows/s into Redis by D dispatcher processes (no worker)
    python -m benchmarks.bench_dt pipeline --n 10000 [--dispatchers 1] [--workers 1]
        end to end from the outbox: D dispatcher + W worker processes start together;
        rate = N / (last finished_at - first sent_at)
    python -m benchmarks.bench_dt submit --n 3000
        one transaction per request: business row + bare outbox row, vs business row + submit()
    python -m benchmarks.bench_dt batch --n 500 [--db sqlite:////tmp/b.db]
        submit_many of N tasks in one transaction, without keys and with new keys, 5 times
        each: the median transaction and its tasks/s
    python -m benchmarks.bench_dt latency --n 1000 --rate 200
        paced submits (one per transaction, NOTIFY on) with a warm worker and dispatcher:
        submit->start (inside the handler) and submit->result (result committed) p50/p99;
        DT_BENCH_PROFILE=<file> profiles the worker process: pyinstrument's text report, or
        cProfile's stats on CPU time when the name ends in .pstats
    python -m benchmarks.bench_dt embedded --n 10000
        App() with no URLs (SQLite + embedded Valkey) in a temp data dir; drain rate
    python -m benchmarks.bench_dt drain --n 10000 --db mysql+pymysql://root@127.0.0.1:3306/test
        any case on another database (a fresh MySQL database per run; metrics get "_mysql")
    python -m benchmarks.bench_dt rss --n 100000
        VmRSS of one worker process (from /proc/<pid>/status) over N tasks submitted while it
        runs (with one dispatcher): idle start, peak, idle end, and a (tasks done, MiB) series

Prints one JSON object per line: name, metric (a stable id), value, unit, n and details.
Postgres and Redis come from DT_BENCH_DATABASE_URL / DT_BENCH_REDIS_URL (default: the local
servers); every run uses a fresh namespace and its own Postgres schema, both dropped at the
end, and deletes the Redis keys of its namespace (and only those).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa
from sqlmodel import Session

from benchmarks.proc_cpu import server_cpu, server_cpu_since
from durable_tasks import App, TaskContext
from durable_tasks.migrations import migrate
from durable_tasks.process import tune_gc
from durable_tasks.records import outbox_table, tasks_table
from durable_tasks.settings import Settings
from durable_tasks.valkey_keeper import die_with_parent

DB = os.environ.get("DT_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("DT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Worker concurrency of the drain runs (the runtime's default: DEFAULT_CONCURRENCY). In-flight counts tasks
# waiting for their group commit, so a deep window keeps the claim, run and commit stages
# overlapped; pgqueuer and dbos run with no limit at all.
DRAIN_CONCURRENCY = 1000
DEFAULT_CONCURRENCY: int = Settings.model_fields["concurrency"].default
READY_TIMEOUT = 120.0

t = tasks_table.c
o = outbox_table.c


def on_mysql() -> bool:
    """Whether this run's database is MySQL/MariaDB (``--db``): its metrics get a ``_mysql``
    suffix, so that they sit beside PostgreSQL's in one summary instead of mixing with them."""
    return sa.engine.make_url(DB).get_backend_name() == "mysql"


def record(name: str, value: float | None, unit: str, **extra: Any) -> None:
    if isinstance(value, float):
        value = round(value, 3)
    if on_mysql() and "metric" in extra:
        extra["metric"] = f"{extra['metric']}_mysql"
        name = f"{name} [MySQL/MariaDB]"
    print(json.dumps({"name": name, "value": value, "unit": unit, **extra}), flush=True)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def p50_p99(values: list[float]) -> list[float]:
    return [round(statistics.median(values), 2), round(pct(values, 99), 2)]


def quarter_medians(pairs: list[tuple[float, float]]) -> list[float]:
    """Medians of the values in each quarter of the (time, value) pairs, in time order."""
    ordered = [v for _, v in sorted(pairs)]
    parts = [ordered[q * len(ordered) // 4 : (q + 1) * len(ordered) // 4] for q in range(4)]
    return [round(statistics.median(part), 2) for part in parts if part]


def seconds(d: datetime) -> float:
    """Epoch seconds of a stored timestamp (SQLite may hand back naive UTC)."""
    from datetime import UTC

    return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()


@contextmanager
def schema() -> Iterator[str]:
    """A fresh Postgres schema, MySQL database or SQLite file (an in-memory SQLite URL as is);
    yields the URL to use."""
    url = sa.engine.make_url(DB)
    if url.get_backend_name() == "mysql":
        name = f"dt_bench_{uuid.uuid4().hex[:8]}"
        admin = sa.create_engine(url)
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{name}`"))
            admin.dispose()
        return
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        # A file of its own beside the one named, as each Postgres case gets its own schema
        # (a case that keeps several apps open would otherwise count the others' rows).
        path = Path(url.database).with_name(f"dt_bench_{uuid.uuid4().hex[:8]}.db")
        try:
            yield url.set(database=str(path)).render_as_string(hide_password=False)
        finally:
            for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                leftover.unlink(missing_ok=True)
        return
    if url.get_backend_name() != "postgresql":
        yield DB
        return
    name = f"dt_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{name}"'))
    try:
        yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


def build(db: str | None, namespace: str, redis: str | None = REDIS, **settings: Any) -> App:
    app = App(db, redis, namespace, **settings)

    @app.task(name="bench.noop", queue="bench")
    async def noop(ctx: TaskContext[int], n: int) -> int:
        return n

    @app.task(name="bench.stamp", queue="bench")
    async def stamp(ctx: TaskContext[float], ts: float) -> float:
        return time.time()  # when the handler ran: submit->start is this minus the payload

    @app.task(name="bench.stamp_body", queue="bench")
    async def stamp_body(ctx: TaskContext[list[Any]], sent: list[Any]) -> list[float]:
        return [sent[0], time.time()]  # [submitted, handler ran]; the body (sent[1]) came along

    return app


@contextmanager
def bench_app(*, schema_version: int | None = None, **settings: Any) -> Iterator[tuple[App, str, str]]:
    """A fresh schema + namespace and an App on them; cleans up its Redis keys at the end. The
    schema is migrated to ``schema_version`` (default: the latest, as ``create_all`` does).

    The cases that submit a backlog first and then measure a dispatcher or workers on it pass
    ``publish_on_commit=False``: the backlog then waits in the outbox, as a backlog built while
    no dispatcher or Redis ran does, and the dispatcher measured publishes every row itself.
    """
    with schema() as db:
        ns = f"bench{uuid.uuid4().hex[:6]}"
        app = build(db, ns, **settings)
        if schema_version is None:
            app.create_all()
        else:
            migrate(app.engine, to=schema_version)
        try:
            yield app, db, ns
        finally:
            delete_keys(REDIS, ns)
            app.engine.dispose()


def delete_keys(redis_url: str, namespace: str) -> None:
    """Delete the keys of this run's namespace (dt:{<ns>:...}): nothing anyone else created."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        batch = []
        for key in client.scan_iter(match=f"dt:{{{namespace}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


def submit_many(
    app: App, n: int, per_txn: int = 500, task: str = "bench.noop", payload: Callable[[int], Any] = int
) -> float:
    """Submit ``n`` tasks, ``per_txn`` a transaction (``payload(i)`` the i-th's payload)."""
    started = time.perf_counter()
    for lo in range(0, n, per_txn):
        with Session(app.engine) as s:
            for i in range(lo, min(n, lo + per_txn)):
                app.submit(s, task, payload(i))
            s.commit()
    elapsed = time.perf_counter() - started
    analyze(app)
    return elapsed


def analyze(app: App) -> None:
    """Refresh the planner's statistics after a bulk load, as autovacuum does on a live table
    within a minute: without them Postgres plans the batch statements for an empty table."""
    if app.engine.dialect.name == "postgresql":
        with app.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE dt_tasks")
            conn.exec_driver_sql("ANALYZE dt_outbox")


async def dispatch_all(app: App) -> float:
    started = time.perf_counter()
    for _ in range(10_000_000):  # bounded: each pass moves up to batch_size rows
        if not await app.dispatch_once():
            break
    return time.perf_counter() - started


# -- child processes -------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


class Children:
    """Worker/dispatcher processes of one measurement, released together through a barrier."""

    #: The module whose ``_<role>`` commands the children run.
    module = "benchmarks.bench_dt"

    def __init__(self, db: str | None, ns: str, **env: str) -> None:
        self.barrier = Path(tempfile.mkdtemp(prefix="dtbench-barrier-"))
        self.env = {**os.environ, "DT_BENCH_DB": db or "", "DT_BENCH_NS": ns, "DT_BENCH_BARRIER": str(self.barrier)}
        self.env.update(env)
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, role: str, count: int = 1, **env: str) -> list[subprocess.Popen[bytes]]:
        started = [
            subprocess.Popen(
                [sys.executable, "-m", self.module, f"_{role}"],
                env={**self.env, **env},
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
            for _ in range(count)
        ]
        self.procs += started
        return started

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(list(self.barrier.glob("ready.*"))) >= len(self.procs):
                return
            dead = [p.returncode for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a benchmark process exited before it was ready (codes {dead})")
            time.sleep(0.05)
        raise TimeoutError(f"benchmark processes not ready after {timeout:.0f} s")

    def go(self) -> None:
        (self.barrier / "go").touch()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()  # by pid: a process this run started
                p.wait(timeout=10)
        shutil.rmtree(self.barrier, ignore_errors=True)

    def cpu_seconds(self) -> list[float]:
        """Each child's CPU time so far (user + system, from /proc/<pid>/stat), in spawn order."""
        return [cpu_seconds(p.pid) for p in self.procs]

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def child_app(**settings: Any) -> App:
    db = os.environ["DT_BENCH_DB"] or None
    data_dir = os.environ.get("DT_BENCH_DATA_DIR")
    if data_dir:  # the embedded default: no URLs at all
        return build(None, os.environ["DT_BENCH_NS"], redis=None, data_dir=Path(data_dir), **settings)
    return build(db, os.environ["DT_BENCH_NS"], **settings)


def run_child(app: App, *, dispatcher: bool = True, worker: bool = True) -> None:
    """Connect, say ready, wait for the go file (if there is a barrier), then run."""
    # A shell without job control starts background jobs (nohup ... &) with SIGINT ignored, and
    # children inherit that: restore Python's handler so the parent's SIGINT stops us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    barrier = os.environ.get("DT_BENCH_BARRIER")

    def ready_then_wait_for_go() -> None:
        assert barrier is not None
        Path(barrier, f"ready.{os.getpid()}").touch()
        deadline = time.monotonic() + READY_TIMEOUT * 2
        while not Path(barrier, "go").exists() and time.monotonic() < deadline:
            time.sleep(0.005)

    tune_gc(app.settings)  # as the CLI's worker and dispatcher do

    async def main() -> None:
        await app.check_connections()
        if barrier:
            await anyio.to_thread.run_sync(ready_then_wait_for_go)
        await app.run(dispatcher=dispatcher, worker=worker, reaper=False)

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(main)


def worker_main() -> None:
    app = child_app(concurrency=int(os.environ.get("DT_BENCH_CONC", str(DRAIN_CONCURRENCY))))
    store_class = type(app.runtime.store)
    # When a stage ends that no column stamps: the group commit returned (the latency run's
    # "result commit": finished_at is stamped before the transaction starts), and the claim
    # returned (started_at is stamped before it is sent).
    if log := os.environ.get("DT_BENCH_COMMIT_LOG"):
        log_returns(Path(log), store_class, "commit_results", lambda writes: [w.claim.task_id for w in writes])
    if log := os.environ.get("DT_BENCH_CLAIM_LOG"):
        log_returns(Path(log), store_class, "claim_executions", lambda _ns, requests: [r.task_id for r in requests])
    report = os.environ.get("DT_BENCH_PROFILE")
    if not report:
        run_child(app, dispatcher=False)
    elif report.endswith(".pstats"):  # cProfile on CPU time: calls and their cost, all on the loop's thread
        deterministic = cProfile.Profile(time.process_time)
        deterministic.enable()
        try:
            run_child(app, dispatcher=False)
        finally:
            deterministic.disable()
            deterministic.dump_stats(report)
    else:  # pyinstrument: the event loop thread, where the PostgreSQL store's calls run
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001, async_mode="disabled")  # where CPU goes, the loop's waits apart
        profiler.start()
        try:
            run_child(app, dispatcher=False)
        finally:
            profiler.stop()
            text = profiler.output_text(unicode=False, show_all=os.environ.get("DT_BENCH_PROFILE_ALL") == "1")
            Path(report).write_text(text, encoding="utf-8")


def log_returns(path: Path, store_class: type[Any], method: str, task_ids: Callable[..., Sequence[str]]) -> None:
    """Append "task_id epoch_seconds" to ``path`` each time ``store_class.<method>`` returns, one
    line per task id that ``task_ids`` reads from the call's positional arguments."""
    original = getattr(store_class, method)
    out = path.open("a", encoding="ascii")

    @functools.wraps(original)
    async def logged(self: Any, *args: Any, **kwargs: Any) -> Any:
        returned = await original(self, *args, **kwargs)
        done = time.time()
        out.writelines(f"{task_id} {done:.6f}\n" for task_id in task_ids(*args))
        out.flush()
        return returned

    setattr(store_class, method, logged)


def dispatcher_main() -> None:
    batch = os.environ.get("DT_BENCH_BATCH")
    app = child_app(**({"batch_size": int(batch)} if batch else {}))
    run_child(app, worker=False)


def wait_count(app: App, ns: str, n: int, timeout: float, *, outbox: bool = False) -> int:
    """Poll until n tasks SUCCEEDED (or n outbox rows SENT); returns the count reached."""
    if outbox:
        query = sa.select(sa.func.count()).where(o.namespace == ns, o.state == "SENT")
    else:
        query = sa.select(sa.func.count()).where(t.namespace == ns, t.state == "SUCCEEDED")
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline:
        with app.runtime.store.read_engine.connect() as conn:
            done = conn.execute(query).scalar_one()
        if done >= n:
            break
        time.sleep(0.2)
    return done


def span(app: App, ns: str, first: Any, last: Any) -> float:
    """Seconds from the earliest ``first`` to the latest ``last`` in this run's namespace; the
    two timestamp columns may live in different tables (dt_outbox, dt_tasks)."""
    with app.runtime.store.read_engine.connect() as conn:
        lo = conn.execute(sa.select(sa.func.min(first)).where(first.table.c.namespace == ns)).scalar_one()
        hi = conn.execute(sa.select(sa.func.max(last)).where(last.table.c.namespace == ns)).scalar_one()
    return seconds(hi) - seconds(lo)


# -- measurements ----------------------------------------------------------------------------


def drain(n: int, workers: int, concurrency: int = DRAIN_CONCURRENCY, timeout: float = 600) -> None:
    tag = f"_c{concurrency}" if concurrency != DRAIN_CONCURRENCY else ""
    metric = f"drain_rate_w{workers}{tag}"
    with bench_app(batch_size=500, publish_on_commit=False) as (app, db, ns):
        submit_many(app, n)
        record(
            "dispatch rate (in-process loop, batch 500)",
            n / anyio.run(dispatch_all, app),
            "rows/s",
            metric="dispatch_inprocess_rate",
            n=n,
        )
        with Children(db, ns, DT_BENCH_CONC=str(concurrency)) as kids:
            kids.spawn("worker", workers)
            kids.wait_ready()
            kids.go()
            done = wait_count(app, ns, n, timeout)
        name = f"drain rate ({workers} worker process{'es' if workers > 1 else ''}, concurrency {concurrency})"
        if done < n:
            record(name, None, "tasks/s", metric=metric, n=n, error=f"only {done}/{n} succeeded in {timeout:.0f} s")
            return
        rate = n / span(app, ns, t.started_at, t.finished_at)
        record(name, rate, "tasks/s", metric=metric, n=n, workers=workers, concurrency=concurrency)


def readme(n: int, timeout: float = 600) -> None:
    """The README's path: ``def`` handler, pydantic payload, dict result, one ``durable-tasks
    worker`` process at every default setting (concurrency included); rate as in drain."""
    from benchmarks import readme_app

    with bench_app(batch_size=500, publish_on_commit=False) as (app, db, ns):
        readme_app.register(app)
        for lo in range(0, n, 500):
            with Session(app.engine) as s:
                for i in range(lo, min(n, lo + 500)):
                    app.submit(s, readme_app.TASK, readme_app.request(i), idempotency_key=f"sub-{i}")
                s.commit()
        analyze(app)
        anyio.run(dispatch_all, app)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DT_") or k.startswith("DT_BENCH_")}
        env.update(DT_BENCH_DB=db, DT_BENCH_REDIS=REDIS, DT_BENCH_NS=ns)
        cli = str(Path(sys.executable).with_name("durable-tasks"))
        worker = subprocess.Popen(
            [cli, "worker", "benchmarks.readme_app:app"],
            env=env,
            cwd=Path(__file__).parents[1],
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        try:
            cpu_at_start = cpu_at_first_start(app, ns, worker.pid, timeout)
            done = wait_count(app, ns, n, timeout)
            cpu_us = (cpu_seconds(worker.pid) - cpu_at_start) * 1e6 / n  # wait_count's polls end within 0.2 s
        finally:
            worker.send_signal(signal.SIGINT)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()  # by pid: the worker this run started
                worker.wait(10)
        name = "README path (def handler, pydantic payload, dict result, `durable-tasks worker` at defaults)"
        if done < n:
            record(name, None, "tasks/s", metric="readme_drain_rate", n=n, error=f"only {done}/{n} in {timeout:.0f} s")
            return
        rate = n / span(app, ns, t.started_at, t.finished_at)
        record(
            name,
            rate,
            "tasks/s",
            metric="readme_drain_rate",
            n=n,
            concurrency=app.settings.concurrency,
            worker_cpu_us_per_task=round(cpu_us, 1),
        )


def cpu_at_first_start(app: App, ns: str, pid: int, timeout: float) -> float:
    """The worker's CPU time when the first task of the run started (its imports and start-up
    before that are not the drain's)."""
    query = sa.select(sa.func.count()).where(t.namespace == ns, t.started_at.is_not(None))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with app.runtime.store.read_engine.connect() as conn:
            if conn.execute(query).scalar_one():
                break
        time.sleep(0.01)
    return cpu_seconds(pid)


def dispatch(n: int, dispatchers: int, batch: int | None, timeout: float = 600) -> None:
    with bench_app(publish_on_commit=False) as (app, db, ns):
        submit_many(app, n)
        env = {"DT_BENCH_BATCH": str(batch)} if batch else {}
        with Children(db, ns, **env) as kids:
            kids.spawn("dispatcher", dispatchers)
            kids.wait_ready()
            kids.go()
            done = wait_count(app, ns, n, timeout, outbox=True)
        metric = f"dispatch_rate_d{dispatchers}"
        label = (
            f"dispatcher rows/s ({dispatchers} dispatcher process{'es' if dispatchers > 1 else ''}, "
            f"batch {batch or app.settings.batch_size})"
        )
        if done < n:
            record(label, None, "rows/s", metric=metric, n=n, error=f"only {done}/{n} sent in {timeout:.0f} s")
            return
        record(
            label,
            n / span(app, ns, o.sent_at, o.sent_at),
            "rows/s",
            metric=metric,
            n=n,
            dispatchers=dispatchers,
            batch=batch or app.settings.batch_size,
        )


def pipeline(
    n: int, dispatchers: int, workers: int, concurrency: int = DRAIN_CONCURRENCY, timeout: float = 600
) -> None:
    with bench_app(publish_on_commit=False) as (app, db, ns):
        submit_many(app, n)
        with Children(db, ns, DT_BENCH_CONC=str(concurrency)) as kids:
            kids.spawn("worker", workers)
            kids.spawn("dispatcher", dispatchers)
            kids.wait_ready()
            kids.go()
            done = wait_count(app, ns, n, timeout)
        metric = f"pipeline_rate_d{dispatchers}_w{workers}"
        label = (
            f"outbox->result rate ({dispatchers} dispatcher + {workers} worker process{'es' if workers > 1 else ''})"
        )
        if done < n:
            record(label, None, "tasks/s", metric=metric, n=n, error=f"only {done}/{n} succeeded in {timeout:.0f} s")
            return
        record(
            label,
            n / span(app, ns, o.sent_at, t.finished_at),
            "tasks/s",
            metric=metric,
            n=n,
            dispatchers=dispatchers,
            workers=workers,
            concurrency=concurrency,
        )
        record(
            f"dispatcher rows/s during that run ({dispatchers} dispatcher{'s' if dispatchers > 1 else ''})",
            n / span(app, ns, o.sent_at, o.sent_at),
            "rows/s",
            metric=f"pipeline_dispatch_rate_d{dispatchers}",
            n=n,
        )


def latency(
    n: int, rate: float, producers: int = 1, timeout: float = 120, concurrency: int = DEFAULT_CONCURRENCY
) -> None:
    logs = Path(tempfile.mkdtemp(prefix="dt-bench-latency-"))
    commit_log, claim_log = logs / "result-commits.log", logs / "claim-returns.log"
    with bench_app() as (app, db, ns):
        with Children(
            db,
            ns,
            DT_BENCH_CONC=str(concurrency),
            DT_BENCH_COMMIT_LOG=str(commit_log),
            DT_BENCH_CLAIM_LOG=str(claim_log),
        ) as kids:
            kids.spawn("worker")  # kids.procs[0]
            kids.spawn("dispatcher")  # kids.procs[1]
            kids.wait_ready()
            kids.go()
            with Session(app.engine) as s:  # warm-up: the first task pays for connections and imports
                app.submit(s, "bench.stamp", -1.0)
                s.commit()
            if wait_count(app, ns, 1, 60) < 1:
                record(
                    f"submit->result p50 @{rate:g}/s",
                    None,
                    "ms",
                    metric="result_latency_p50",
                    error="warm-up task did not finish",
                )
                return
            cpu_before, servers_before = kids.cpu_seconds(), server_cpu()
            t0 = time.perf_counter()
            submitted: dict[str, float] = {}  # task id -> when its submit transaction committed

            def produce(first: int) -> None:  # producer k takes slots k, k+K, k+2K, ... of the schedule
                for i in range(first, n, producers):
                    due = t0 + i / rate
                    if (delay := due - time.perf_counter()) > 0:
                        time.sleep(delay)
                    with Session(app.engine) as s:
                        handle = app.submit(s, "bench.stamp", time.time())
                        s.commit()
                    submitted[handle.id] = time.time()

            threads = [threading.Thread(target=produce, args=(k,)) for k in range(producers)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            achieved = n / (time.perf_counter() - t0)
            done = wait_count(app, ns, n + 1, timeout)
            # CPU per task of each process over the run (wait_count's polls end within 0.2 s of
            # the last task; an idle process spends next to nothing meanwhile)
            cpu_ms = [(b - a) * 1000 / n for a, b in zip(cpu_before, kids.cpu_seconds(), strict=True)]
            server_roles = {role: used * 1000 / n for role, used in server_cpu_since(servers_before).items() if used}
        if done < n + 1:
            record(
                f"submit->result p50 @{rate:g}/s",
                None,
                "ms",
                metric="result_latency_p50",
                error=f"only {done - 1}/{n} finished in {timeout:.0f} s",
            )
            return
        with app.runtime.store.read_engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.id, t.payload, t.result, t.finished_at, t.started_at, o.sent_at)
                .join(outbox_table, o.task_id == t.id)
                .where(t.namespace == ns)
            ).all()
        committed = dict(line.split() for line in commit_log.read_text(encoding="ascii").splitlines())
        claim_returned = dict(line.split() for line in claim_log.read_text(encoding="ascii").splitlines())
        shutil.rmtree(logs, ignore_errors=True)
        # (submit time, ms) pairs: the time orders them into quarters of the run
        commit_pairs = [(at, (float(committed[i]) - at) * 1000) for i, at in submitted.items() if i in committed]
        commit_to_commit = [ms for _, ms in commit_pairs]
        start, result = [], []
        # Stages of the commit -> commit path; their p50s need not add up to its p50.
        stages: dict[str, list[tuple[float, float]]] = {  # (submit time, ms) per stage
            "submit": [],  # the submit call and its transaction's commit, as the peers' figures start
            "submit commit->claimed": [],  # the publish at commit, the worker's read; claimed = claim sent
            "claimed->handler": [],  # the claim statement, then the attempt's start
            "claimed->claim returned": [],  # the store's claim alone
            "claim returned->handler": [],  # the attempt's start
            "handler->committed": [],  # the handler, up to when its group commit was sent
            "committed->result commit": [],  # the group commit statement
            "submit commit->dispatcher sent": [],  # off the path: the dispatcher's publish (a dedup hit)
        }
        for task_id, payload, res, finished, claimed, sent in rows:
            ts = json.loads(payload)
            if ts < 0:
                continue
            ran = json.loads(res)
            start.append((ran - ts) * 1000)
            result.append((seconds(finished) - ts) * 1000)
            if task_id in submitted and task_id in committed:
                at = submitted[task_id]
                stages["submit"].append((ts, (at - ts) * 1000))
                stages["submit commit->claimed"].append((ts, (seconds(claimed) - at) * 1000))
                stages["committed->result commit"].append((ts, (float(committed[task_id]) - seconds(finished)) * 1000))
                if sent is not None:  # the dispatcher may mark the row after the task finished
                    stages["submit commit->dispatcher sent"].append((ts, (seconds(sent) - at) * 1000))
            stages["claimed->handler"].append((ts, (ran - seconds(claimed)) * 1000))
            if task_id in claim_returned:
                returned = float(claim_returned[task_id])
                stages["claimed->claim returned"].append((ts, (returned - seconds(claimed)) * 1000))
                stages["claim returned->handler"].append((ts, (ran - returned) * 1000))
            stages["handler->committed"].append((ts, (seconds(finished) - ran) * 1000))
        extra = {
            "n": len(start),
            "rate": rate,
            "achieved_rate": round(achieved, 1),
            "producers": producers,
            "notify": True,
        }
        record(f"submit->start p50 @{rate:g}/s", statistics.median(start), "ms", metric="start_latency_p50", **extra)
        record(f"submit->start p99 @{rate:g}/s", pct(start, 99), "ms", metric="start_latency_p99", **extra)
        record(f"submit->result p50 @{rate:g}/s", statistics.median(result), "ms", metric="result_latency_p50", **extra)
        record(f"submit->result p99 @{rate:g}/s", pct(result, 99), "ms", metric="result_latency_p99", **extra)
        # The target's definition: from the submit transaction's commit (the producer's clock
        # when commit() returned) to the result's commit (the worker's, when its group commit
        # returned). The figures above start before the submit call, as the peers' do.
        both = {**extra, "n": len(commit_to_commit)}
        record(
            f"submit commit->result commit p50 @{rate:g}/s",
            statistics.median(commit_to_commit),
            "ms",
            metric="commit_latency_p50",
            **both,
        )
        record(
            f"submit commit->result commit p99 @{rate:g}/s",
            pct(commit_to_commit, 99),
            "ms",
            metric="commit_latency_p99",
            **both,
        )
        record(
            "CPU per task: worker, dispatcher process",
            None,
            "ms",
            metric="latency_cpu_per_task",
            worker=round(cpu_ms[0], 3),
            dispatcher=round(cpu_ms[1], 3),
            **extra,
        )
        # The same as the peers' (benchmarks/peers/driver.py): the processes that run the tasks
        # (worker and dispatcher here), and the local PostgreSQL and Redis servers, the
        # submits' work included.
        record(
            "CPU per task at the paced rate: worker + dispatcher processes",
            sum(cpu_ms),
            "ms",
            metric="latency_worker_cpu_per_task",
            **extra,
        )
        record(
            "CPU per task at the paced rate: PostgreSQL and Redis servers",
            sum(server_roles.values()),
            "ms",
            metric="latency_server_cpu_per_task",
            by_role={role: round(ms, 3) for role, ms in sorted(server_roles.items())},
            **extra,
        )
        record(
            "latency stages p50/p99 (claimed = worker's claim sent; claim returned = the store's claim "
            "returned; committed = group commit sent; result commit = it returned; dispatcher sent = its "
            "mark of the row, off the path)",
            None,
            "ms",
            metric="latency_stages",
            stages={k: p50_p99([ms for _, ms in pairs]) for k, pairs in stages.items()},
            **extra,
        )
        # The stages' p50 in each quarter of the run, by submit time: a drift from the first
        # quarter to the last is a cost that grows with the tasks already done.
        record(
            "latency stages p50 by quarter of the run",
            None,
            "ms",
            metric="latency_stages_by_quarter",
            stages={
                "submit commit->result commit": quarter_medians(commit_pairs),
                **{name: quarter_medians(pairs) for name, pairs in stages.items()},
            },
            **extra,
        )
        record(
            "submit->start samples",
            None,
            "ms",
            metric="start_latency_samples",
            samples=[round(x, 2) for x in start],
            **extra,
        )
        record(
            "submit->result samples",
            None,
            "ms",
            metric="result_latency_samples",
            samples=[round(x, 2) for x in result],
            **extra,
        )


def batch_submit(n: int, rounds: int = 5) -> None:
    """``submit_many`` of ``n`` no-op tasks in one transaction, ``rounds`` times without keys and
    as many with new keys: the median transaction and the tasks/s it gives."""
    with bench_app() as (app, _db, _ns):
        for keyed in (False, True):
            took = []
            for r in range(rounds):
                items = [(i, f"batch-{r}-{i}" if keyed else None) for i in range(n)]
                started = time.perf_counter()
                with Session(app.engine) as s:
                    app.submit_many(s, "bench.noop", items)
                    s.commit()
                took.append(time.perf_counter() - started)
            median = statistics.median(took)
            record(
                f"submit_many of {n} tasks ({'new keys' if keyed else 'no keys'}), one transaction",
                n / median,
                "tasks/s",
                metric="batch_submit_rate_keyed" if keyed else "batch_submit_rate",
                n=n,
                rounds=rounds,
                median_ms=round(median * 1000, 2),
            )


def submit_overhead(n: int, block: int = 100) -> None:
    """One transaction per simulated request, interleaved in blocks so drift hits all modes alike.

    bare:        INSERT business row + INSERT bare outbox row, COMMIT
    bare_notify: the same + pg_notify (what a hand-rolled outbox needs to wake its relay)
    dt:          INSERT business row + app.submit() (task row + outbox row + NOTIFY), COMMIT
    dt_sender:   the same, the publish at commit sent by the sender thread alone (not written
                 by the committing thread: what that write saves)
    dt_keyed:    the same with an idempotency key (a judge's submission id), COMMIT
    dt_only:     app.submit() alone, COMMIT (the number to compare with peers' enqueue rate)

    Each block also reads where its CPU went: the submitting thread, the process's other threads
    (the publish at commit's sender), the local PostgreSQL backends and Redis (from /proc).
    """
    meta = sa.MetaData()
    orders = sa.Table(
        "bench_orders",
        meta,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("customer", sa.String(64), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    bare_outbox = sa.Table(
        "bench_bare_outbox",
        meta,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("topic", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True)),
    )
    with bench_app() as (app, _db, _ns):
        meta.create_all(app.engine)
        postgres = app.engine.dialect.name == "postgresql"

        def business(s: Session, i: int) -> None:
            s.execute(sa.insert(orders).values(customer=f"c{i % 97}", amount=i, created_at=app.clock()))

        def bare(s: Session, i: int, notify: bool = False) -> None:
            business(s, i)
            s.execute(sa.insert(bare_outbox).values(topic="bench.noop", payload=json.dumps(i), created_at=app.clock()))
            if notify and postgres:
                s.execute(sa.select(sa.func.pg_notify("dt_bench_bare", "x")))

        def bare_notify(s: Session, i: int) -> None:
            bare(s, i, notify=True)

        def dt(s: Session, i: int) -> None:
            business(s, i)
            app.submit(s, "bench.noop", i)

        def dt_keyed(s: Session, i: int) -> None:
            business(s, i)
            app.submit(s, "bench.noop", i, idempotency_key=f"order-{i}")

        def dt_only(s: Session, i: int) -> None:
            app.submit(s, "bench.noop", i)

        modes: dict[str, Callable[[Session, int], None]] = {
            "bare": bare,
            "bare_notify": bare_notify,
            "dt": dt,
            "dt_sender": dt,
            "dt_keyed": dt_keyed,
            "dt_only": dt_only,
        }
        times: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [0.0] * 4 for m in modes}  # thread, other threads, postgres, redis
        order = list(modes)
        for warm in range(n, n + 20):  # connections, statement caches (past the measured keys)
            for fn in modes.values():
                with Session(app.engine) as s:
                    fn(s, warm)
                    s.commit()
        analyze(app)  # a live table has statistics: plans as a long-running application's
        for b in range((n + block - 1) // block):
            order = order[1:] + order[:1]  # rotate which mode goes first
            for m in order:
                fn = modes[m]
                app.runtime.wakeups.flush()  # the last block's publishes, before the switch
                app.runtime.wakeups.direct_writes = m != "dt_sender"
                servers, process, thread = server_cpu(), time.process_time(), time.thread_time()
                for i in range(b * block, min(n, (b + 1) * block)):
                    t0 = time.perf_counter()
                    with Session(app.engine) as s:
                        fn(s, i)
                        s.commit()
                    times[m].append(time.perf_counter() - t0)
                thread = time.thread_time() - thread
                process = time.process_time() - process
                used = server_cpu_since(servers)
                redis = sum(v for role, v in used.items() if role.startswith(("redis", "valkey")))
                for k, v in enumerate((thread, process - thread, used.get("postgres backend", 0.0), redis)):
                    cpu[m][k] += v
        for m, xs in times.items():
            ms = [x * 1000 for x in xs]
            record(
                f"submit txn/s ({m})",
                len(xs) / sum(xs),
                "txn/s",
                metric=f"submit_{m}_txn_per_s",
                n=len(xs),
                p50_ms=round(statistics.median(ms), 3),
                p99_ms=round(pct(ms, 99), 3),
            )
        per_txn = {m: [round(v / len(times[m]) * 1e6, 1) for v in cpu[m]] for m in modes}
        record(
            "submit CPU per transaction: submitting thread, other threads, PostgreSQL backends, Redis",
            None,
            "us",
            metric="submit_cpu_per_txn",
            modes=per_txn,
            dt_minus_bare=[round(a - b, 1) for a, b in zip(per_txn["dt"], per_txn["bare"], strict=True)],
        )
        bare_mean, dt_mean = statistics.fmean(times["bare"]), statistics.fmean(times["dt"])
        record(
            "submit overhead: (business + submit) / (business + bare outbox row), mean txn time",
            dt_mean / bare_mean,
            "x",
            metric="submit_overhead_ratio",
            n=n,
            added_ms=round((dt_mean - bare_mean) * 1000, 3),
        )
        record(
            "submit overhead vs bare outbox + NOTIFY, mean txn time",
            dt_mean / statistics.fmean(times["bare_notify"]),
            "x",
            metric="submit_overhead_ratio_vs_notify",
            n=n,
        )
        record(
            "submit overhead with the publish sent by the sender thread alone, mean txn time",
            statistics.fmean(times["dt_sender"]) / bare_mean,
            "x",
            metric="submit_overhead_ratio_sender",
            n=n,
        )
        record(
            "submit overhead with an idempotency key, mean txn time",
            statistics.fmean(times["dt_keyed"]) / bare_mean,
            "x",
            metric="submit_overhead_ratio_keyed",
            n=n,
        )
        record(
            "submit overhead, p50 txn time",
            statistics.median(times["dt"]) / statistics.median(times["bare"]),
            "x",
            metric="submit_overhead_ratio_p50",
            n=n,
        )


def embedded(n: int, concurrency: int = DRAIN_CONCURRENCY, timeout: float = 600) -> None:
    """The zero-configuration default: App() with no URLs, SQLite + embedded Valkey, temp dir."""
    for var in ("DT_DATABASE_URL", "DT_REDIS_URL", "DT_DATA_DIR"):
        os.environ.pop(var, None)  # "no URLs" must mean none, whatever this shell exports
    data_dir = Path(tempfile.mkdtemp(prefix="dtbench-embedded-"))
    ns = f"bench{uuid.uuid4().hex[:6]}"
    app = build(None, ns, redis=None, data_dir=data_dir, batch_size=500, publish_on_commit=False)
    try:
        app.create_all()
        submit_many(app, n)
        record(
            "embedded dispatch rate (in-process loop, batch 500)",
            n / anyio.run(dispatch_all, app),
            "rows/s",
            metric="embedded_dispatch_inprocess_rate",
            n=n,
        )
        with Children(None, ns, DT_BENCH_DATA_DIR=str(data_dir), DT_BENCH_CONC=str(concurrency)) as kids:
            kids.spawn("worker")
            kids.wait_ready()
            kids.go()
            done = wait_count(app, ns, n, timeout)
        name = "embedded default drain rate (SQLite + embedded Valkey, 1 worker process)"
        if done < n:
            record(
                name, None, "tasks/s", metric="embedded_drain_rate", n=n, error=f"only {done}/{n} in {timeout:.0f} s"
            )
            return
        record(
            name,
            n / span(app, ns, t.started_at, t.finished_at),
            "tasks/s",
            metric="embedded_drain_rate",
            n=n,
            concurrency=concurrency,
        )
    finally:
        app.engine.dispose()
        app.stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)


def rss_of(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB, from /proc/<pid>/status."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def rss(n: int, concurrency: int = DRAIN_CONCURRENCY, timeout: float = 1800) -> None:
    """Worker memory over n tasks: idle after start-up, peak, and idle at the end.

    One worker and one dispatcher process run while this process submits the n tasks (500
    per transaction), so submitting and working overlap; a thread samples the worker's
    VmRSS at 10 Hz throughout.
    """
    with bench_app() as (app, db, ns):
        with Children(db, ns, DT_BENCH_CONC=str(concurrency), DT_BENCH_BATCH="500") as kids:
            (worker,) = kids.spawn("worker")
            kids.spawn("dispatcher")
            kids.wait_ready()
            kids.go()
            time.sleep(2.0)  # idle, connected, consumer group joined
            start_rss, _ = rss_of(worker.pid)
            samples: list[float] = [start_rss]
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.1):
                    with contextlib.suppress(OSError, KeyError):
                        samples.append(rss_of(worker.pid)[0])

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            query = sa.select(sa.func.count()).where(t.namespace == ns, t.state == "SUCCEEDED")
            series: list[tuple[int, float]] = []
            done, next_count = 0, 0.0

            def observe() -> None:
                nonlocal done, next_count
                if time.monotonic() >= next_count:
                    with app.runtime.store.read_engine.connect() as conn:
                        done = conn.execute(query).scalar_one()
                    series.append((done, round(samples[-1], 1)))
                    next_count = time.monotonic() + 1.0

            started = time.perf_counter()
            for lo in range(0, n, 500):
                with Session(app.engine) as s:
                    for i in range(lo, min(n, lo + 500)):
                        app.submit(s, "bench.noop", i)
                    s.commit()
                observe()
            submit_s = time.perf_counter() - started
            deadline = time.monotonic() + timeout
            while done < n and time.monotonic() < deadline:
                observe()
                time.sleep(0.1)
            elapsed = time.perf_counter() - started
            time.sleep(2.0)  # idle again
            stop.set()
            sampler.join(5)
            end_rss, hwm = rss_of(worker.pid)
        extra: dict[str, Any] = {
            "n": n,
            "tasks_done": done,
            "concurrency": concurrency,
            "submit_seconds": round(submit_s, 1),
            "total_seconds": round(elapsed, 1),
        }
        if done < n:
            extra["error"] = f"only {done}/{n} succeeded in {timeout:.0f} s"
        record("worker RSS at start (idle, connected)", start_rss, "MiB", metric="worker_rss_start_mb", **extra)
        record(
            "worker RSS peak (max of 10 Hz samples and VmHWM)",
            max(max(samples), hwm),
            "MiB",
            metric="worker_rss_peak_mb",
            **extra,
        )
        record("worker RSS at end (idle)", end_rss, "MiB", metric="worker_rss_end_mb", **extra)
        record("worker RSS series (tasks done, MiB)", None, "MiB", metric="worker_rss_series", series=series, **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "what",
        choices=[
            "drain",
            "readme",
            "dispatch",
            "pipeline",
            "submit",
            "batch",
            "latency",
            "embedded",
            "rss",
            "_worker",
            "_dispatcher",
        ],
    )
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dispatchers", type=int, default=1)
    ap.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help=f"worker concurrency (default: {DRAIN_CONCURRENCY} in drains, {DEFAULT_CONCURRENCY} in latency)",
    )
    ap.add_argument("--batch", type=int, default=None, help="dispatcher batch size (default: the runtime's)")
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--producers", type=int, default=1, help="latency: threads sharing the paced schedule")
    ap.add_argument("--timeout", type=float, default=None, help="bound on waiting for completion, seconds")
    ap.add_argument("--db", default=None, help="database URL instead of DT_BENCH_DATABASE_URL (e.g. MySQL/MariaDB)")
    a = ap.parse_args()
    if a.db:
        global DB
        DB = a.db
    bound = {"timeout": a.timeout} if a.timeout else {}
    if a.what == "latency" and a.concurrency:
        bound["concurrency"] = a.concurrency
    a.concurrency = a.concurrency or DRAIN_CONCURRENCY
    if a.what == "drain":
        drain(a.n, a.workers, a.concurrency, **bound)
    elif a.what == "readme":
        readme(a.n, **bound)
    elif a.what == "dispatch":
        dispatch(a.n, a.dispatchers, a.batch, **bound)
    elif a.what == "pipeline":
        pipeline(a.n, a.dispatchers, a.workers, a.concurrency, **bound)
    elif a.what == "submit":
        submit_overhead(a.n)
    elif a.what == "batch":
        batch_submit(a.n)
    elif a.what == "latency":
        latency(a.n, a.rate, a.producers, **bound)
    elif a.what == "embedded":
        embedded(a.n, a.concurrency, **bound)
    elif a.what == "rss":
        rss(a.n, a.concurrency, **bound)
    elif a.what == "_worker":
        worker_main()
    else:
        dispatcher_main()


if __name__ == "__main__":
    main()
