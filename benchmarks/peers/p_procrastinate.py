"""procrastinate 3.10 on PostgreSQL (LISTEN/NOTIFY); worker --concurrency=1 (its default), async task."""

import time

import procrastinate
from peerlib import pace, pg_url, rec, recreate_db

DATABASE = "dtbench_procrastinate"
BACKEND = "postgres"
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_url(DATABASE)))
CONFIG = "worker --concurrency=1 (default), async task, LISTEN/NOTIFY"
WORKER_CMD = ["procrastinate", "--app=p_procrastinate.app", "worker", "--concurrency=1"]


@app.task(name="noop")
async def noop(ts):
    rec(ts)


def reset():
    recreate_db(DATABASE)
    with app.open():
        app.schema_manager.apply_schema()


def produce(n, rate, warmup=False):
    with app.open():
        t0 = time.perf_counter()
        for i in range(n):
            pace(i, t0, rate)
            noop.defer(ts=-1.0 if warmup else time.time())
        return time.perf_counter() - t0
