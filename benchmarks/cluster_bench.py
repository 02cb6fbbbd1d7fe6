"""Drain throughput of one queue on a real Redis Cluster: 1 stream partition vs 3.

    python -m benchmarks.cluster_bench [--n 5000] [--partitions 1,3] [--concurrency 200]

Starts a 3-master Redis Cluster on loopback ports (``tests.cluster.harness.start_cluster``, no
replicas, no persistence) in a temporary directory, and for each partition count:

1. a fresh Postgres schema (``DT_BENCH_DATABASE_URL``, default the local server) and namespace;
2. submits N no-op async tasks (500 per transaction) to queue ``bench``, split into that many
   partitions (``queue_partitions={"bench": P}``), and dispatches them all in-process (batch 500);
3. runs ONE worker in this process, ``app.work(max_tasks=N)``, and times it from start to
   return (wall clock); it also reports N / (last finished_at - first started_at) from the
   database, the figure ``bench_dt drain`` reports.

Prints one JSON object per line (name, metric, value, unit, details), including which master
each partition's stream landed on. The cluster is stopped (by pid) and the schemas dropped at
the end, also on error or Ctrl-C. Numbers on a shared machine are noisy: run it several times
and compare medians; reverse ``--partitions`` between runs to cancel order effects.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import redis
import sqlalchemy as sa

from benchmarks.bench_dt import DRAIN_CONCURRENCY, build, dispatch_all, record, schema, span, submit_many
from durable_tasks import App
from durable_tasks.records import tasks_table
from durable_tasks.transport.keys import QueueKeys
from tests.cluster.harness import Cluster, start_cluster

QUEUE = "bench"
t = tasks_table.c


def node_ports(cluster: Cluster, keys: list[str]) -> list[int]:
    """The port of the master serving each key."""
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.masters()[0].port, decode_responses=True)
    try:
        return [int(client.get_node_from_key(k).port) for k in keys]  # type: ignore[no-untyped-call]
    finally:
        client.close()


def stream_keys(app: App, partitions: int) -> list[str]:
    ns = app.settings.namespace
    if partitions <= 1:
        return [QueueKeys(ns, QUEUE).stream]
    return [QueueKeys(ns, QUEUE, p).stream for p in range(partitions)]


async def dispatch_timed(app: App) -> float:
    elapsed = await dispatch_all(app)
    await app.aclose()  # this event loop's Redis client; the worker's loop opens its own
    return elapsed


async def work_timed(app: App, n: int, timeout: float) -> tuple[int, float]:
    started = time.perf_counter()
    settled = await app.work(max_tasks=n, timeout=timedelta(seconds=timeout), queues=[QUEUE])
    elapsed = time.perf_counter() - started
    await app.aclose()
    return settled, elapsed


def measure(cluster: Cluster, n: int, partitions: int, concurrency: int, timeout: float) -> dict[str, Any]:
    label = f"{partitions} partition{'s' if partitions > 1 else ''}"
    with schema() as db:
        ns = f"cb{uuid.uuid4().hex[:6]}"
        app = build(
            db,
            ns,
            redis=cluster.url,
            batch_size=500,
            concurrency=concurrency,
            queue_partitions={QUEUE: partitions} if partitions > 1 else {},
        )
        try:
            app.create_all()
            submit_s = submit_many(app, n)
            dispatch_s = anyio.run(dispatch_timed, app)
            keys = stream_keys(app, partitions)
            lengths = {k: int(cluster_len(cluster, k)) for k in keys}
            ports = node_ports(cluster, keys)
            record(
                f"dispatch rate ({label}, in-process loop, batch 500)",
                n / dispatch_s,
                "rows/s",
                metric=f"cluster_dispatch_rate_p{partitions}",
                n=n,
                partitions=partitions,
                submit_s=round(submit_s, 2),
            )
            settled, elapsed = anyio.run(work_timed, app, n, timeout)
            with app.runtime.store.read_engine.connect() as conn:
                done = conn.execute(
                    sa.select(sa.func.count()).where(t.namespace == ns, t.state == "SUCCEEDED")
                ).scalar_one()
            details: dict[str, Any] = {
                "n": n,
                "partitions": partitions,
                "concurrency": concurrency,
                "settled": settled,
                "succeeded": done,
                "entries_per_partition": list(lengths.values()),
                "partition_master_ports": ports,
                "distinct_masters": len(set(ports)),
            }
            name = f"cluster drain rate ({label}, 1 worker process, concurrency {concurrency})"
            if done < n:
                record(name, None, "tasks/s", metric=f"cluster_drain_rate_p{partitions}", error="incomplete", **details)
                return details
            db_rate = n / span(app, ns, t.started_at, t.finished_at)
            record(
                name,
                n / elapsed,
                "tasks/s",
                metric=f"cluster_drain_rate_p{partitions}",
                wall_s=round(elapsed, 3),
                **details,
            )
            record(
                f"cluster drain rate by DB timestamps ({label}: N / (last finished - first started))",
                db_rate,
                "tasks/s",
                metric=f"cluster_drain_rate_db_p{partitions}",
                n=n,
                partitions=partitions,
            )
            details["wall_rate"] = n / elapsed
            return details
        finally:
            app.engine.dispose()


def cluster_len(cluster: Cluster, key: str) -> int:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.masters()[0].port, decode_responses=True)
    try:
        return int(client.xlen(key))
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="tasks per measurement")
    ap.add_argument("--partitions", default="1,3", help="partition counts to measure, in this order")
    ap.add_argument("--concurrency", type=int, default=DRAIN_CONCURRENCY, help="worker concurrency")
    ap.add_argument("--timeout", type=float, default=600, help="bound on one drain, seconds")
    a = ap.parse_args()
    counts = [int(x) for x in a.partitions.split(",") if x.strip()]
    load1, load5, _ = os.getloadavg()
    record(
        "machine",
        None,
        "",
        metric="cluster_bench_machine",
        cpus=os.cpu_count(),
        loadavg_1m=round(load1, 2),
        loadavg_5m=round(load5, 2),
        python=platform.python_version(),
        note="3 cluster masters, Postgres, and the worker all share this machine",
    )
    tmp = Path(tempfile.mkdtemp(prefix="dt-cluster-bench-"))
    cluster: Cluster | None = None
    try:
        cluster = start_cluster(tmp, replicas=False)
        record(
            "cluster",
            None,
            "",
            metric="cluster_bench_nodes",
            master_ports=[node.port for node in cluster.masters()],
        )
        for partitions in counts:
            measure(cluster, a.n, partitions, a.concurrency, a.timeout)
    finally:
        if cluster is not None:
            cluster.stop()  # kills only the nodes this run started, by pid
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
