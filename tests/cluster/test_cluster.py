"""The runtime on a real 3-master Redis Cluster (+ replicas) started on loopback ports."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
import redis
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.dispatcher import Dispatcher
from durable_tasks.records import outbox_table
from durable_tasks.transport.keys import QueueKeys
from tests.cluster.harness import Cluster, start_cluster
from tests.helpers import FAST

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
async def make(cluster: Cluster, postgres_url: str) -> AsyncIterator[Any]:
    apps: list[App] = []
    namespace = f"c{uuid.uuid4().hex[:8]}"

    def build(**overrides: Any) -> App:
        app = App(postgres_url, cluster.url, namespace, **(FAST | overrides))

        @app.task(name="square", queue="jobs")
        def square(ctx: TaskContext[int], n: int) -> int:
            return n * n

        app.create_all()
        apps.append(app)
        return app

    yield build
    for app in apps:
        await app.aclose()


def submit(app: App, n: int, partition_key: str | None = None) -> list[str]:
    with Session(app.engine) as s:
        ids = [app.submit(s, "square", i, partition_key=partition_key).id for i in range(n)]
        s.commit()
    return ids


def node_of(cluster: Cluster, key: str) -> int:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.masters()[0].port, decode_responses=True)
    try:
        node = client.get_node_from_key(key)
        return int(node.port)
    finally:
        client.close()


async def drain(app: App, ids: list[str], timeout: float = 60) -> None:
    with anyio.fail_after(timeout):
        while any(app.get_task(i).state != TaskState.SUCCEEDED for i in ids):
            await app.dispatch_once()
            await app.work(max_tasks=len(ids), timeout=timedelta(seconds=1))
            await app.reap_once()


async def test_a_partitioned_queue_spreads_over_nodes_and_completes(make: Any, cluster: Cluster) -> None:
    app: App = make(queue_partitions={"jobs": 6}, batch_size=50)  # two passes
    ids = submit(app, 60)
    assert await app.dispatch_once() == 50
    assert await app.dispatch_once() == 10
    client = app.runtime.transport().client
    lengths = {p: int(await client.xlen(QueueKeys(app.settings.namespace, "jobs", p).stream)) for p in range(6)}
    assert sum(lengths.values()) == 60
    assert sum(1 for n in lengths.values() if n) >= 4  # the task ids spread over the partitions
    nodes = {node_of(cluster, QueueKeys(app.settings.namespace, "jobs", p).stream) for p in range(6)}
    assert len(nodes) >= 2  # the partitions live on different masters
    assert await app.work(max_tasks=60, timeout=timedelta(seconds=30)) == 60
    assert [app.get_task(i).result for i in ids] == [i * i for i in range(60)]
    stats = (await app.stats())["jobs"]
    assert (stats.pel_size, stats.outbox_backlog) == (0, 0)


async def test_a_dispatcher_woken_by_a_submit_passes_at_once(make: Any) -> None:
    # A submit publishes only the wake-up on a cluster: no head start for the workers to wait out.
    assert Dispatcher(make().runtime).head_start() is None


async def test_a_partition_key_keeps_its_tasks_in_one_partition_in_order(make: Any) -> None:
    app: App = make(queue_partitions={"jobs": 4})
    ids = submit(app, 10, partition_key="user-42")
    await app.dispatch_once()
    client = app.runtime.transport().client
    per_partition = {p: await client.xrange(QueueKeys(app.settings.namespace, "jobs", p).stream) for p in range(4)}
    [(partition, entries)] = [(p, e) for p, e in per_partition.items() if e]
    assert [fields["t"] for _, fields in entries] == ids  # submit order kept within the partition
    with app.runtime.store.read_engine.connect() as conn:
        stored = set(conn.execute(sa.select(outbox_table.c.partition).where(outbox_table.c.task_id.in_(ids))).scalars())
    assert stored == {partition}


async def test_the_reaper_recovers_a_lost_delivery_on_the_cluster(make: Any) -> None:
    app: App = make(queue_partitions={"jobs": 3})
    [task_id] = submit(app, 1)
    await app.dispatch_once()
    assert len(await app.runtime.transport().read(["jobs"], "dies", count=1, block=timedelta(milliseconds=200))) == 1
    await anyio.sleep(1.2)  # past the lease: nobody holds it
    report = await app.reap_once()
    assert report.redelivered == 1
    await drain(app, [task_id])
    assert app.get_task(task_id).delivery == 1


async def test_three_dispatchers_publish_each_row_once(make: Any) -> None:
    apps = [make(queue_partitions={"jobs": 3}, batch_size=20) for _ in range(3)]
    ids = submit(apps[0], 300)
    handled = [0, 0, 0]

    async def dispatch(i: int) -> None:
        while (n := await apps[i].dispatch_once()) > 0:
            handled[i] += n

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(dispatch, i)
    assert sum(handled) == 300
    client = apps[0].runtime.transport().client
    seen: list[str] = []
    for p in range(3):
        seen += [f["t"] for _, f in await client.xrange(QueueKeys(apps[0].settings.namespace, "jobs", p).stream)]
    assert sorted(seen) == sorted(ids)  # every row published once, none twice


async def test_killing_a_master_loses_nothing(make: Any, cluster: Cluster) -> None:
    app: App = make(queue_partitions={"jobs": 6})
    ids = submit(app, 120)
    while await app.dispatch_once():
        pass
    victim = next(
        n for n in cluster.masters() if n.port == node_of(cluster, QueueKeys(app.settings.namespace, "jobs", 0).stream)
    )
    cluster.kill(victim)  # its replica takes over; writes not yet replicated are lost
    cluster.wait_failover(victim)
    await app.aclose()  # reconnect to the new topology
    await drain(app, ids, timeout=90)  # the reconciler re-sends what the failover lost
    infos = [app.get_task(i) for i in ids]
    assert all(sum(a.outcome == "succeeded" for a in info.attempts) == 1 for info in infos)
    assert [info.result for info in infos] == [i * i for i in range(120)]
