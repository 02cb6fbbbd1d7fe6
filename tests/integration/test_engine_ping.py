"""The Postgres engine: pings a pooled connection only after it sat idle, replaces a dead one,
and hands out autocommit connections that go back to the pool transactional."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durable_tasks.store import engine as engine_module


@pytest.fixture
def engine(postgres_url: str, tmp_path: Path) -> Iterator[sa.Engine]:
    eng = engine_module.create_engine(postgres_url, tmp_path)
    yield eng
    eng.dispose()


def _backend_pid(eng: sa.Engine) -> int:
    with eng.connect() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


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
    admin = sa.create_engine(postgres_url)
    try:
        with admin.connect() as conn:
            # waits (up to 5 s) until the backend is gone
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({first}, 5000)").scalar_one()
    finally:
        admin.dispose()
    monkeypatch.setattr(engine_module, "PING_IF_IDLE_S", 0.0)
    second = _backend_pid(engine)  # no error reaches the caller: the pool reconnected
    assert second != first


def test_autocommit_is_one_connections_setting_and_goes_back_with_it(engine: sa.Engine) -> None:
    with engine_module.autocommit(engine) as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        assert conn.connection.driver_connection.autocommit is True  # type: ignore[union-attr]
    with engine.connect() as conn:  # the same pooled connection, transactional again
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == pid
        assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]
