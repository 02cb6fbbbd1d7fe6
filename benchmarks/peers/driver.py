"""One round of one peer, run INSIDE that peer's virtual environment (.bench/venvs/<peer>).

    .bench/venvs/dramatiq/bin/python benchmarks/peers/driver.py dramatiq --n 10000 --lat-n 1000 --lat-rate 200

A) reset; one producer enqueues N no-op tasks, one call at a time, with no worker running
   (enqueue rate); then ONE worker process starts: processing rate = N / (last task finish -
   first task start), both timed inside the task, so worker start-up does not count.
B) reset; a fresh worker; one warm-up task; then L tasks paced at R/s: submit->start latency
   (time.time() in the producer before the enqueue call -> time.time() first thing in the task),
   and the CPU per task of the worker's processes (its session) and of the local PostgreSQL and
   Redis servers over the paced tasks (benchmarks/proc_cpu.py).

Prints one JSON object per line: {"system", "metric", "value", "unit", "round", ...}; a failed
phase has "value": null and "error". Every wait is bounded; each worker runs in its own
session and is stopped by its process group id.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
LOGDIR = os.environ.get("BENCH_LOGDIR", os.path.join(os.path.dirname(os.path.dirname(HERE)), ".bench", "logs"))


def _proc_cpu():
    """benchmarks/proc_cpu.py, loaded by its path: the benchmarks folder on sys.path would
    shadow a peer's own modules (run, record, plot)."""
    path = os.path.join(os.path.dirname(HERE), "proc_cpu.py")
    spec = importlib.util.spec_from_file_location("dt_bench_proc_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


proc_cpu = _proc_cpu()


def emit(peer: str, metric: str, value: float | None, unit: str, **extra: object) -> None:
    if isinstance(value, float):
        value = round(value, 3)
    print(json.dumps({"system": peer, "metric": metric, "value": value, "unit": unit, **extra}), flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def start_worker(mod, expect: int, out: str, tag: str) -> tuple[subprocess.Popen, object]:
    for f in (out, out + ".ready", out + ".tmp"):
        if os.path.exists(f):
            os.unlink(f)
    env = dict(
        os.environ,
        PEER_EXPECT=str(expect),
        PEER_OUT=out,
        PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    cmd = [os.path.join(os.path.dirname(sys.executable), mod.WORKER_CMD[0]), *mod.WORKER_CMD[1:]]
    log = open(os.path.join(LOGDIR, f"{tag}.log"), "w")  # noqa: SIM115 - closed in stop_worker
    proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def stop_worker(proc: subprocess.Popen, log) -> None:
    """SIGTERM the worker's own process group (it leads a new session), SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)
    except ProcessLookupError:
        pass
    log.close()


def wait_file(path: str, timeout: float, proc: subprocess.Popen) -> str | None:
    """None when the file appeared; otherwise why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return None
        if proc.poll() is not None:
            return f"worker exited with code {proc.returncode}"
        time.sleep(0.05)
    return f"timed out after {timeout:.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("peer")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--lat-n", type=int, default=1000)
    ap.add_argument("--lat-rate", type=float, default=200.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="bound on the processing phase, seconds")
    ap.add_argument("--round", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(LOGDIR, exist_ok=True)
    peer = a.peer
    try:
        mod = importlib.import_module("p_" + peer)
    except Exception as exc:
        emit(peer, "import", None, "", round=a.round, error=f"{type(exc).__name__}: {exc}")
        return
    common = {"round": a.round, "config": mod.CONFIG}
    out = os.path.join(LOGDIR, f"{peer}_out.json")

    # A) enqueue with no worker, then drain with one worker process
    try:
        mod.reset()
        elapsed = mod.produce(a.n, 0.0)
        emit(peer, "enqueue_rate", a.n / elapsed, "tasks/s", n=a.n, **common)
        proc, log = start_worker(mod, a.n, out, f"{peer}_A_round{a.round}")
        why = wait_file(out, a.timeout, proc)
        stop_worker(proc, log)
        if why is None:
            with open(out) as f:
                d = json.load(f)
            emit(peer, "processing_rate", a.n / (d["last"] - d["first"]), "tasks/s", n=a.n, **common)
        else:
            emit(peer, "processing_rate", None, "tasks/s", n=a.n, error=why, **common)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        emit(peer, "processing_rate", None, "tasks/s", n=a.n, error=f"{type(exc).__name__}: {exc}", **common)

    # B) submit->start latency at a paced rate, warm worker
    try:
        mod.reset()
        proc, log = start_worker(mod, a.lat_n, out, f"{peer}_B_round{a.round}")
        try:
            mod.produce(1, 0.0, warmup=True)
            why = wait_file(out + ".ready", 60, proc)
            achieved = None
            worker_ms = 0.0
            roles: dict[str, float] = {}
            if why is None:
                worker_cpu, servers = proc_cpu.session_cpu(proc.pid), proc_cpu.server_cpu()
                achieved = a.lat_n / mod.produce(a.lat_n, a.lat_rate)
                why = wait_file(out, 60 + a.lat_n / a.lat_rate, proc)
                # What the paced tasks cost the worker's processes and the servers (PostgreSQL,
                # Redis: the enqueues' work included), per task
                worker_ms = (proc_cpu.session_cpu(proc.pid) - worker_cpu) * 1000 / a.lat_n
                used = proc_cpu.server_cpu_since(servers)
                roles = {role: seconds * 1000 / a.lat_n for role, seconds in used.items() if seconds}
        finally:
            stop_worker(proc, log)
        if why is None:
            with open(out) as f:
                lat = [x * 1000 for x in json.load(f)["lat"]]
            extra = {"n": len(lat), "rate": a.lat_rate, "achieved_rate": round(achieved or 0, 1), **common}
            emit(peer, "start_latency_p50", statistics.median(lat), "ms", **extra)
            emit(peer, "start_latency_p99", pct(lat, 99), "ms", **extra)
            emit(peer, "latency_worker_cpu_per_task", worker_ms, "ms", **extra)
            by_role = {role: round(ms, 3) for role, ms in sorted(roles.items())}
            emit(peer, "latency_server_cpu_per_task", sum(roles.values()), "ms", by_role=by_role, **extra)
            emit(peer, "start_latency_samples", None, "ms", samples=[round(x, 2) for x in lat], **extra)
        else:
            emit(peer, "start_latency_p50", None, "ms", rate=a.lat_rate, error=why, **common)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        emit(peer, "start_latency_p50", None, "ms", rate=a.lat_rate, error=f"{type(exc).__name__}: {exc}", **common)
    try:
        mod.reset()  # leave nothing queued behind
    except Exception:
        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":
    main()
