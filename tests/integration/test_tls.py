"""TLS to Redis for real: a private CA made by the test, a TLS redis-server (one node, then a
cluster of three meeting over TLS), with and without client certificates. A task goes the
whole way (submit, dispatch, work) over each; a client without the certificate a server asks
for is refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.errors import BrokerUnavailableError
from tests.helpers import FAST
from tests.servers import server_home
from tests.tls_redis import MISSING, TlsFiles, tls_cluster, tls_files, tls_redis, tls_redis_binary

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


@pytest.fixture(scope="module")
def binary() -> str:
    found = tls_redis_binary()
    if found is None:
        pytest.skip(MISSING)
    return found


@pytest.fixture(scope="module")
def tls_home() -> Iterator[Path]:
    with server_home("tls") as path:
        yield path


@pytest.fixture(scope="module")
def files(tls_home: Path) -> TlsFiles:
    return tls_files(tls_home / "pki")


async def run_one_task(database_url: str, redis_url: str, namespace: str, data_dir: Path) -> None:
    timings: dict[str, Any] = dict(FAST)
    app = App(database_url, redis_url, namespace, data_dir=data_dir, **timings)
    app.create_all()
    ran: list[int] = []

    @app.task(name="tls.echo", queue="jobs")
    def echo(ctx: TaskContext[int], n: int) -> int:
        ran.append(n)
        return n

    try:
        with Session(app.engine) as s:
            task_id = echo.submit(s, 7).id
            s.commit()
        await app.check_connections()
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=20)) == 1
        assert app.get_task(task_id).state == TaskState.SUCCEEDED
        assert ran == [7]
    finally:
        await app.aclose()


@pytest.mark.parametrize("client_certs", [False, True], ids=["server-cert-only", "client-certs"])
async def test_a_task_goes_the_whole_way_over_tls_to_one_node(
    binary: str, files: TlsFiles, tls_home: Path, database_url: str, namespace: str, tmp_path: Path, client_certs: bool
) -> None:
    with tls_redis(binary, files, tls_home / f"single-{namespace}", client_certs=client_certs) as node:
        await run_one_task(database_url, node.url(), namespace, tmp_path)


@pytest.mark.parametrize("client_certs", [False, True], ids=["server-cert-only", "client-certs"])
async def test_a_multi_seed_rediss_cluster_url_keeps_its_tls_options(
    binary: str, files: TlsFiles, tls_home: Path, database_url: str, namespace: str, tmp_path: Path, client_certs: bool
) -> None:
    with tls_cluster(binary, files, tls_home / f"cluster-{namespace}", client_certs=client_certs) as cluster:
        url = cluster.url()
        assert url.startswith("rediss+cluster://127.0.0.1:")
        assert url.count(",") == 2  # three seeds
        await run_one_task(database_url, url, namespace, tmp_path)


async def test_a_client_without_the_certificate_the_cluster_asks_for_is_refused(
    binary: str, files: TlsFiles, tls_home: Path, database_url: str, namespace: str, tmp_path: Path
) -> None:
    with tls_cluster(binary, files, tls_home / f"refuse-{namespace}", client_certs=True) as cluster:
        app = App(database_url, cluster.url(client_cert=False), namespace, data_dir=tmp_path)
        app.create_all()
        try:
            with pytest.raises(BrokerUnavailableError):
                await app.check_connections()
        finally:
            await app.aclose()


async def test_a_client_that_does_not_trust_the_ca_is_refused(
    binary: str, files: TlsFiles, tls_home: Path, database_url: str, namespace: str, tmp_path: Path
) -> None:
    with tls_redis(binary, files, tls_home / f"untrusted-{namespace}", client_certs=False) as node:
        app = App(database_url, f"rediss://127.0.0.1:{node.port}/0", namespace, data_dir=tmp_path)
        app.create_all()
        try:
            with pytest.raises(BrokerUnavailableError):
                await app.check_connections()
        finally:
            await app.aclose()
