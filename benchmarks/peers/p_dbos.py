"""dbos 3.4 queues on PostgreSQL (durable workflows); worker: one process, Queue defaults
(polling_interval_sec=1.0, no concurrency limit). The queue is registered after DBOS.launch()."""

import os
import subprocess
import sys
import time

from dbos import DBOS, DBOSClient, EnqueueOptions
from peerlib import pace, pg_url, rec, recreate_db

DATABASE = "dtbench_dbos"
BACKEND = "postgres"
URL = pg_url(DATABASE)
CONFIG = "Queue defaults (polling_interval_sec=1.0, no concurrency limit), 1 process"
WORKER_CMD = ["python", "p_dbos.py", "worker"]


@DBOS.workflow(name="noop")
def noop(ts):
    rec(ts)


def reset():
    recreate_db(DATABASE)
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, os.path.join(here, "p_dbos.py"), "migrate"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise RuntimeError(f"dbos migrate failed: {done.stderr[-500:]}")


def produce(n, rate, warmup=False):
    client = DBOSClient(system_database_url=URL)
    opts: EnqueueOptions = {"queue_name": "bench_queue", "workflow_name": "noop"}
    t0 = time.perf_counter()
    for i in range(n):
        pace(i, t0, rate)
        client.enqueue(opts, -1.0 if warmup else time.time())
    elapsed = time.perf_counter() - t0
    client.destroy()
    return elapsed


if __name__ == "__main__":
    DBOS(config={"name": "dtbench", "system_database_url": URL, "run_admin_server": False})
    DBOS.launch()
    DBOS.register_queue("bench_queue")
    if sys.argv[1] == "migrate":  # launching creates the system tables; nothing else to do
        DBOS.destroy()
    else:  # the driver stops this process; the bound only guards against a lost driver
        deadline = time.monotonic() + float(os.environ.get("PEER_MAX_SECONDS", "3600"))
        while time.monotonic() < deadline:
            time.sleep(1)
