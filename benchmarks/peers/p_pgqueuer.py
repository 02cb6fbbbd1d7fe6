"""pgqueuer 1.6 on PostgreSQL (LISTEN/NOTIFY); PgQueuer.run() defaults, started from this script
(`pgq run` 1.6.0 crashed while setting up its logging)."""

import asyncio
import os
import subprocess
import sys
import time

import asyncpg
from peerlib import apace, pg_url, rec, recreate_db
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

DATABASE = "dtbench_pgqueuer"
BACKEND = "postgres"
DSN = pg_url(DATABASE)
CONFIG = "PgQueuer.run() defaults (batch-size 10, no concurrency limit), LISTEN/NOTIFY"
WORKER_CMD = ["python", "p_pgqueuer.py"]


async def build() -> PgQueuer:
    conn = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        rec(job.payload.decode())

    return pgq


def reset():
    recreate_db(DATABASE)
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "pgq"), "--pg-dsn", DSN, "install"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise RuntimeError(f"pgq install failed: {done.stderr[-500:]}")


def produce(n, rate, warmup=False):
    async def go():
        conn = await asyncpg.connect(DSN)
        q = Queries(AsyncpgDriver(conn))
        t0 = time.perf_counter()
        for i in range(n):
            await apace(i, t0, rate)
            await q.enqueue("noop", str(-1.0 if warmup else time.time()).encode())
        elapsed = time.perf_counter() - t0
        await conn.close()
        return elapsed

    return asyncio.run(go())


if __name__ == "__main__":

    async def _run() -> None:
        pgq = await build()
        await pgq.run()

    asyncio.run(_run())
