"""The Postgres store's engine: pings a pooled connection only after it sat idle, replaces a
dead one, and the runtime's own transactions on it fail like any statement on a dead one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from durable_tasks.store import engine as engine_module
from durable_tasks.store.postgres import PostgresStore


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore.open(sa.make_url(postgres_url))
    yield opened
    opened.close()


@pytest.fixture
def engine(store: PostgresStore) -> sa.Engine:
    return store.engine


def _backend_pid(eng: sa.Engine) -> int:
    with eng.connect() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _terminate_backend(postgres_url: str, pid: int) -> None:
    """Kill one server process from another connection; waits (up to 5 s) until it is gone."""
    admin = sa.create_engine(postgres_url)
    try:
        with admin.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid}, 5000)").scalar_one()
    finally:
        admin.dispose()


def _count_pings(eng: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pings: list[int] = []
    real = eng.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        pings.append(1)
        return real(dbapi_conn)

    monkeypatch.setattr(eng.dialect, "do_ping", counted)
    return pings


def test_a_connection_reused_at_once_is_not_pinged(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pings = _count_pings(engine, monkeypatch)
    first = _backend_pid(engine)
    assert [_backend_pid(engine) for _ in range(5)] == [first] * 5
    assert pings == []


def test_an_idle_connection_is_pinged(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pings = _count_pings(engine, monkeypatch)
    first = _backend_pid(engine)
    monkeypatch.setattr(engine_module, "PING_IF_IDLE_S", 0.0)
    assert _backend_pid(engine) == first  # alive: pinged, then reused
    assert pings == [1]


def test_a_dead_idle_connection_is_replaced_before_use(
    engine: sa.Engine, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _backend_pid(engine)
    _terminate_backend(postgres_url, first)
    monkeypatch.setattr(engine_module, "PING_IF_IDLE_S", 0.0)
    second = _backend_pid(engine)  # no error reaches the caller: the pool reconnected
    assert second != first


def test_a_runtime_transaction_on_a_dead_connection_raises_a_sqlalchemy_error_and_the_next_one_works(
    store: PostgresStore, postgres_url: str
) -> None:
    """The runtime's transactions on the pool start with a SET LOCAL (store.postgres.planner);
    on a connection that died it fails as any statement would, with an error of SQLAlchemy's
    family (heartbeats and the reaper treat those as an outage), and the pool replaces it."""
    runtime = store.runtime_engine
    pid = _backend_pid(runtime)
    _terminate_backend(postgres_url, pid)
    with pytest.raises(sa.exc.OperationalError), runtime.begin() as conn:  # reused at once: no ping
        conn.exec_driver_sql("SELECT 1")
    with runtime.begin() as conn:
        assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "off"
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid
