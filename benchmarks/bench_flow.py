"""Flow control (durable_tasks.flow), measured: a shared rate limit across workers, and the
cost of the features when they are not used.

    python -m benchmarks.bench_flow rate [--n 300] [--rate 20/s] [--burst 5]
        one shared limit (app.limit) over 3 task names, 2 worker processes (one also runs the
        dispatcher); every task's start (dt_tasks.started_at, stamped by the claim that follows
        admission). Prints the most starts in any 5 s window per second against rate + burst
        (and the count against GCRA's 5 s x rate + burst), and the total time against what the
        rate allows, (n - burst) / rate.
    python -m benchmarks.bench_flow overhead [--n 5000] [--rounds 3] [--baseline-ref REF]
        benchmarks.bench_dt drain (1 worker, no priority, no limit) on this checkout and on
        REF (default: the commit before flow control, 7402d50), alternating in one run; the
        median of the ratios of adjacent runs is the cost of the features' presence on the
        path that does not use them (adjacent runs share the machine's load of the moment).
        REF is exported with `git archive` into a temporary directory.

    python -m benchmarks.bench_flow hooks [--n 1000] [--rounds 3]
        the flow-control calls on the path of tasks that use no feature, in-process, in ns per
        task (read batches of n; rounds x 100 batches): the cost that overhead's drain ratio
        cannot resolve on a noisy machine.

Prints one JSON object per line (name, value, unit, details), like benchmarks.bench_dt.
Postgres and Redis: DT_BENCH_DATABASE_URL / DT_BENCH_REDIS_URL (default: the local servers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa
from sqlmodel import Session

from benchmarks.bench_dt import REDIS, Children, analyze, delete_keys, record, run_child, schema, seconds
from durable_tasks import App, TaskContext
from durable_tasks.flow.gate import holder
from durable_tasks.records import tasks_table

REPO = Path(__file__).resolve().parents[1]
#: main before flow control landed: the baseline of the overhead comparison.
BASELINE_REF = "7402d50"
NAMES = ("flow.a", "flow.b", "flow.c")
WINDOW_S = 5.0

t = tasks_table.c


def build(db: str | None, namespace: str, rate: str, burst: int) -> App:
    """Three task names sharing one limit."""
    app = App(db, REDIS, namespace, batch_size=500)
    shared = app.limit("shared", rate=rate, burst=burst)
    for name in NAMES:

        @app.task(name=name, queue="bench", rate_limit=shared)
        async def call(ctx: TaskContext[int], n: int) -> int:
            return n

    return app


@contextlib.contextmanager
def flow_app(rate: str, burst: int) -> Iterator[tuple[App, str, str]]:
    with schema() as db:
        ns = f"bench{os.urandom(3).hex()}"
        app = build(db, ns, rate, burst)
        app.create_all()
        try:
            yield app, db, ns
        finally:
            delete_keys(REDIS, ns)
            app.engine.dispose()


def starts(app: App, ns: str, n: int, timeout: float) -> list[float]:
    """Wait until n tasks succeeded; their start times (epoch seconds), sorted."""
    deadline = time.monotonic() + timeout
    query = sa.select(t.started_at).where(t.namespace == ns, t.state == "SUCCEEDED")
    found: list[datetime] = []
    while time.monotonic() < deadline:
        with app.engine.connect() as conn:
            found = list(conn.execute(query).scalars())
        if len(found) >= n:
            break
        time.sleep(0.5)
    return sorted(seconds(s) for s in found)


def most_in_window(times: list[float], window: float) -> int:
    """The most times that fall in any half-open window of ``window`` seconds."""
    best, lo = 0, 0
    for hi, at in enumerate(times):
        while at - times[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


class FlowChildren(Children):
    """bench_dt's barrier-released children, running this module's worker."""

    module = "benchmarks.bench_flow"


def rate_run(n: int, rate: str, burst: int, timeout: float) -> None:
    per_s = float(rate.split("/")[0]) / {"s": 1, "m": 60, "h": 3600}[rate.split("/")[1]]
    with flow_app(rate, burst) as (app, db, ns):
        with Session(app.engine) as s:
            for i in range(n):
                app.submit(s, NAMES[i % len(NAMES)], i)
            s.commit()
        analyze(app)
        env = {"DT_BENCH_FLOW_RATE": rate, "DT_BENCH_FLOW_BURST": str(burst)}
        with FlowChildren(db, ns, **env) as kids:
            kids.spawn("flow_worker", 1, DT_BENCH_FLOW_DISPATCHER="1")
            kids.spawn("flow_worker", 1)
            kids.wait_ready()
            kids.go()
            times = starts(app, ns, n, timeout)
    if len(times) < n:
        record("shared rate limit", None, "tasks", error=f"only {len(times)}/{n} succeeded in {timeout:.0f} s")
        return
    most = most_in_window(times, WINDOW_S)
    # The bound is a rate: starts per second over the window <= rate + burst. GCRA's own
    # is tighter, a count: <= window x rate + burst admissions. Starts are claim timestamps, a
    # little after each admission and not evenly so, which can crowd a window by a few.
    record(
        f"most starts in any {WINDOW_S:.0f} s window, per second (limit {rate}, burst {burst}, 2 workers, 3 names)",
        most / WINDOW_S,
        "tasks/s",
        metric="flow_rate_window_max",
        bound=per_s + burst,
        within=most / WINDOW_S <= per_s + burst,
        starts=most,
        gcra_bound=WINDOW_S * per_s + burst,
        n=n,
    )
    total = times[-1] - times[0]
    expected = (n - burst) / per_s
    record(
        "first to last start", total, "s", metric="flow_rate_total", expected=round(expected, 3), ratio=total / expected
    )


def child_main() -> None:
    app = build(
        os.environ["DT_BENCH_DB"] or None,
        os.environ["DT_BENCH_NS"],
        os.environ["DT_BENCH_FLOW_RATE"],
        int(os.environ["DT_BENCH_FLOW_BURST"]),
    )
    run_child(app, dispatcher=os.environ.get("DT_BENCH_FLOW_DISPATCHER") == "1")


def drain_once(cwd: Path, n: int) -> float | None:
    """One ``benchmarks.bench_dt drain`` run with the code in ``cwd``; its rate."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_dt", "drain", "--n", str(n), "--workers", "1"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        row: dict[str, Any] = json.loads(line)
        if str(row.get("metric", "")).startswith("drain_rate"):
            value = row.get("value")
            return None if value is None else float(value)
    return None


def overhead(n: int, rounds: int, ref: str) -> None:
    with tempfile.TemporaryDirectory(prefix="dtbench-baseline-") as tmp:
        archive = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        baseline = Path(tmp)
        pairs: list[tuple[float, float]] = []
        for _ in range(rounds):  # alternating: a drift of the machine falls on both sides of a pair
            this, base = drain_once(REPO, n), drain_once(baseline, n)
            if this is not None and base is not None:
                pairs.append((this, base))
    record(
        f"drain rate without flow-control features, this code / {ref} (median of {len(pairs)} adjacent pairs)",
        statistics.median(a / b for a, b in pairs),
        "ratio",
        metric="flow_overhead_ratio",
        this=[round(a) for a, _ in pairs],
        baseline=[round(b) for _, b in pairs],
        median_this=round(statistics.median(a for a, _ in pairs)),
        median_baseline=round(statistics.median(b for _, b in pairs)),
        n=n,
    )


def hooks(batch: int, rounds: int) -> None:
    """The flow-control calls a worker makes for tasks that use no feature, timed in-process:
    per read batch (admission, release of unclaimed deliveries, the prioritized-queue check of
    the read and of each publish) and per task (release at the end). No server is touched: the
    gate returns before any I/O when no task declares a limit."""
    from durable_tasks.transport.messages import Delivery, OutgoingMessage, StreamEntry

    app = App("sqlite://", REDIS, "benchhooks")

    @app.task(name="bench.noop", queue="bench")
    async def noop(ctx: TaskContext[int], n: int) -> int:
        return n

    gate, runtime = app.runtime.flow, app.runtime
    items = [
        (StreamEntry("bench", False, f"{i}-0", {}), Delivery(f"task-{i}", 0, 0, "bench.noop", None), None)
        for i in range(batch)
    ]
    claims = [object()] * batch

    messages = [OutgoingMessage("bench", f"task-{i}", 0, 0, "bench.noop") for i in range(batch)]

    async def per_batch() -> None:
        transport = runtime.transport()  # made once per event loop; no connection until used
        await gate.admit_entries(items, lambda *a, **k: None, lambda _: _done())  # type: ignore[arg-type]
        gate.unclaimed(items, claims)
        runtime.prioritized("bench")  # the read's check
        for msg in messages:  # the dispatcher's publish, per message
            transport.level_of(msg)
        for _, d, _ in items:  # the end of each attempt
            gate.release_soon([holder(d)])

    async def run() -> float:
        started = time.perf_counter()
        for _ in range(rounds):
            await per_batch()
        return time.perf_counter() - started

    elapsed = anyio.run(run)
    record(
        "flow-control calls on the path of a task that uses no feature",
        elapsed / (rounds * batch) * 1e9,
        "ns/task",
        metric="flow_hooks_ns_per_task",
        batch=batch,
        tasks=rounds * batch,
    )


async def _done() -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["rate", "overhead", "hooks", "_flow_worker"])
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--rate", default="20/s")
    ap.add_argument("--burst", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    if a.what == "rate":
        rate_run(a.n or 300, a.rate, a.burst, a.timeout)
    elif a.what == "overhead":
        overhead(a.n or 5000, a.rounds, a.baseline_ref)
    elif a.what == "hooks":
        hooks(a.n or 1000, a.rounds * 100)
    else:
        child_main()


if __name__ == "__main__":
    main()
