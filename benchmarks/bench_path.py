"""The path users write, A/B in one process: handler kinds and concurrencies, alternated.

    python -m benchmarks.bench_path handlers [--n 5000] [--rounds 3] [--concurrency 16,1000]
        [--kinds async,sync,sync_model] [--work noop|io|cpu] [--io-seconds 0.05]

Each round drains N pre-submitted, pre-dispatched tasks of each kind with one in-process
Worker at each concurrency, in rotating order, and prints the rate (N over the worker's wall
time). Medians over rounds, and each kind's ratio to the async handler at the same
concurrency, close the run. Kinds:

    async       ``async def`` handler, float payload, float result (the headline's task)
    sync        ``def`` handler, float payload, float result
    sync_model  ``def`` handler, pydantic payload, dict result (the README's task)
    async_model ``async def`` handler, pydantic payload, dict result
    <kind>+anyio  a sync kind through ``anyio.to_thread`` (the A/B of the worker's own threads)
    <kind>+eager  a sync kind with a sibling thread woken whenever items wait (``stall=0``)

``--work``: ``noop`` returns at once; ``io`` waits 50 ms (``--io-seconds``; ``time.sleep`` in a
sync handler, ``anyio.sleep`` in an async one); ``cpu`` spends about 1 ms of CPU in pure Python.
The worker's settings come from the environment as an App's do (``DT_HANDLER_THREADS=512``).
Absolute figures depend on what else the machine runs: compare within one run. Each drain's
line also gives the process's peak RSS during it (``peak_rss_mib``: VmHWM, reset before the
drain), e.g. what 1,000 blocking sync handlers' threads hold; threads an earlier drain left
idle (they end after 10 s) still count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel
from sqlmodel import Session

from benchmarks.bench_dt import analyze, bench_app, dispatch_all
from benchmarks.bench_scale import reset_peak_rss, rss_mb
from durable_tasks import App, TaskContext
from durable_tasks.process import tune_gc
from durable_tasks.worker import Worker

KINDS = ("async", "sync", "sync_model", "async_model")


class Submission(BaseModel):
    """The README's payload shape."""

    submission_id: int
    code: str


@dataclass(frozen=True)
class Work:
    """What each handler does: ``noop``, ``io`` (wait ``io_seconds``) or ``cpu``."""

    kind: str
    io_seconds: float = 0.05

    def __str__(self) -> str:
        return self.kind if self.kind != "io" else f"io {self.io_seconds:g} s"


def spend(work: Work) -> None:
    """The sync handlers' body."""
    if work.kind == "io":
        time.sleep(work.io_seconds)
    elif work.kind == "cpu":
        x = 0
        for i in range(20_000):  # about 1 ms of pure Python on a 2-core VM
            x += i * i


async def aspend(work: Work) -> None:
    """The async handlers' body."""
    if work.kind == "io":
        await anyio.sleep(work.io_seconds)
    else:
        spend(work)


def register(app: App, work: Work) -> None:
    """One task per kind, each on a queue of its own (a drain reads only its kind)."""

    @app.task(name="path.async", queue="path.async")
    async def h_async(ctx: TaskContext[float], x: float) -> float:
        await aspend(work)
        return x

    @app.task(name="path.sync", queue="path.sync")
    def h_sync(ctx: TaskContext[float], x: float) -> float:
        spend(work)
        return x

    @app.task(name="path.sync_model", queue="path.sync_model")
    def h_sync_model(ctx: TaskContext[Submission], req: Submission) -> dict[str, str]:
        spend(work)
        return {"verdict": "AC", "id": str(req.submission_id)}

    @app.task(name="path.async_model", queue="path.async_model")
    async def h_async_model(ctx: TaskContext[Submission], req: Submission) -> dict[str, str]:
        await aspend(work)
        return {"verdict": "AC", "id": str(req.submission_id)}


def payload(kind: str, i: int) -> Any:
    return Submission(submission_id=i, code="print(42)\n" * 4) if kind.endswith("_model") else float(i)


def submit_kind(app: App, kind: str, n: int, per_txn: int = 500) -> None:
    for lo in range(0, n, per_txn):
        with Session(app.engine) as s:
            for i in range(lo, min(n, lo + per_txn)):
                app.submit(s, f"path.{kind}", payload(kind, i))
            s.commit()


async def drain_kind(app: App, kind: str, n: int, concurrency: int) -> tuple[float, float]:
    """(tasks/s, process CPU µs per task) of one worker over n ready tasks of ``kind``; a kind
    ending in ``+anyio`` runs its sync handlers through ``anyio.to_thread`` instead of the
    worker's own threads (the A/B of durable_tasks.handler_threads)."""
    base = kind.removesuffix("+anyio").removesuffix("+eager")
    worker = Worker(app.runtime, queues=[f"path.{base}"], concurrency=concurrency)
    if kind.endswith("+eager"):
        worker._handler_threads.stall = 0
    if kind.endswith("+anyio"):
        limiter = anyio.CapacityLimiter(concurrency)

        async def via_anyio(fn: Callable[..., Any], *args: Any) -> Any:
            return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=limiter)

        worker._handler_threads.run_sync = via_anyio  # type: ignore[method-assign]
    started, cpu = time.perf_counter(), time.process_time()
    settled = await worker.run(max_tasks=n)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if settled < n:
        raise RuntimeError(f"{kind}: only {settled}/{n} settled")
    return n / elapsed, cpu / n * 1e6


def handlers(n: int, rounds: int, concurrencies: list[int], kinds: list[str], work: Work) -> None:
    rates: dict[tuple[str, int], list[float]] = defaultdict(list)
    cpus: dict[tuple[str, int], list[float]] = defaultdict(list)
    with bench_app(batch_size=500) as (app, _db, _ns):
        register(app, work)
        tune_gc(app.settings)
        cases = [(k, c) for c in concurrencies for k in kinds]
        for rnd in range(rounds):
            shift = rnd % len(cases)
            for kind, conc in cases[shift:] + cases[:shift]:
                submit_kind(app, kind.removesuffix("+anyio").removesuffix("+eager"), n)
                analyze(app)
                anyio.run(dispatch_all, app)
                reset_peak_rss()
                rate, cpu = anyio.run(drain_kind, app, kind, n, conc)
                peak_rss = rss_mb()[1]
                rates[(kind, conc)].append(rate)
                cpus[(kind, conc)].append(cpu)
                print(json.dumps({"round": rnd + 1, "kind": kind, "concurrency": conc, "work": str(work),
                                  "rate": round(rate, 1), "cpu_us_per_task": round(cpu, 1),
                                  "peak_rss_mib": round(peak_rss, 1)}), flush=True)  # fmt: skip
    print(f"\n== {work} handlers, {n} tasks, median of {rounds} round(s); x async = async rate / kind's ==")
    for conc in concurrencies:
        base = statistics.median(rates[("async", conc)]) if ("async", conc) in rates else None
        for kind in kinds:
            med = statistics.median(rates[(kind, conc)])
            ratio = f"{base / med:.2f} x async" if base else ""
            cpu = statistics.median(cpus[(kind, conc)])
            print(f"   concurrency {conc:>5}  {kind:<18}{med:>9,.0f} tasks/s {cpu:>7,.0f} µs CPU/task   {ratio}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["handlers"])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="16,1000", help="comma list")
    ap.add_argument("--kinds", default="async,sync,sync_model", help="comma list of " + ",".join(KINDS))
    ap.add_argument("--work", default="noop", choices=["noop", "io", "cpu"])
    ap.add_argument("--io-seconds", type=float, default=0.05, help="how long an io handler waits")
    a = ap.parse_args(argv)
    kinds = a.kinds.split(",")
    unknown = {k.removesuffix("+anyio").removesuffix("+eager") for k in kinds} - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown kinds {sorted(unknown)}; choose from {KINDS} (sync ones +anyio, +eager too)")
    handlers(a.n, a.rounds, [int(c) for c in a.concurrency.split(",")], kinds, Work(a.work, a.io_seconds))


if __name__ == "__main__":
    main()
