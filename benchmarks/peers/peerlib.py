"""Helpers shared by every peer module; imported inside each peer's own virtual environment.

Only the standard library here: each peer venv holds just that peer and its client libraries.

Environment (set by ``benchmarks/run.py``):
    BENCH_REDIS_URL      redis://127.0.0.1:PORT  (a private redis-server the run started; no db suffix)
    BENCH_REDIS_PRIVATE  "1" when that server belongs to this run: only then may a peer FLUSHDB its own db
    BENCH_PG_URL         postgresql://postgres@127.0.0.1:5432  (no database: each peer uses dtbench_<peer>)
    PEER_EXPECT, PEER_OUT  how many recorded tasks end a phase, and where the worker writes its timings
"""

from __future__ import annotations

import json
import os
import threading
import time

_lock = threading.Lock()
_state: dict = {"n": 0, "first": None, "lat": []}
EXPECT = int(os.environ.get("PEER_EXPECT", "0"))
OUT = os.environ.get("PEER_OUT", "/tmp/dtbench_peer_out.json")


def rec(ts: float | str) -> None:
    """Called first thing inside every peer's no-op task with the producer's time.time() at submit.

    A negative ts is the warm-up task: it only tells the driver that the worker consumes.
    When EXPECT tasks have been recorded the worker writes first start, last finish and every
    submit->start latency (seconds) to OUT.
    """
    now = time.time()
    ts = float(ts)
    if ts < 0:
        open(OUT + ".ready", "w").close()
        return
    with _lock:
        if _state["first"] is None:
            _state["first"] = now
        _state["lat"].append(now - ts)
        _state["n"] += 1
        if _state["n"] == EXPECT:
            with open(OUT + ".tmp", "w") as f:
                json.dump({"first": _state["first"], "last": time.time(), "n": _state["n"], "lat": _state["lat"]}, f)
            os.replace(OUT + ".tmp", OUT)


def pace(i: int, t0: float, rate: float) -> None:
    """Sleep until task i of a paced stream is due (rate 0: no pacing)."""
    if rate:
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


async def apace(i: int, t0: float, rate: float) -> None:
    import asyncio

    if rate:
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


def redis_url(db: int) -> str:
    return f"{os.environ.get('BENCH_REDIS_URL', 'redis://127.0.0.1:6379').rstrip('/')}/{db}"


def pg_url(dbname: str) -> str:
    return f"{os.environ.get('BENCH_PG_URL', 'postgresql://postgres@127.0.0.1:5432').rstrip('/')}/{dbname}"


def flush_redis(db: int) -> None:
    """Empty this peer's db, but only on the private server the run started (never a shared Redis)."""
    if os.environ.get("BENCH_REDIS_PRIVATE") != "1":
        raise RuntimeError("refusing to FLUSHDB: BENCH_REDIS_URL is not a private server started by benchmarks.run")
    import redis

    client = redis.Redis.from_url(redis_url(db))
    try:
        client.flushdb()
    finally:
        client.close()


def recreate_db(name: str) -> None:
    """Drop and create one of the run's own databases (always named dtbench_*)."""
    if not name.startswith("dtbench_"):
        raise ValueError(f"not a benchmark database: {name}")
    import psycopg

    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
