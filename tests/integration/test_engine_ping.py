"""The Postgres engine: pings a pooled connection only after it sat idle, replaces a dead one,
and runs the hot one-statement transactions on a pooled connection that goes back transactional."""

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


def test_execute_alone_commits_one_statement_and_returns_plain_rows(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE IF NOT EXISTS dt_alone (v int) ON COMMIT PRESERVE ROWS")
    # temp tables are per connection: the pool hands the same one back when nothing else holds it
    rows = engine_module.execute_alone(
        engine, "INSERT INTO dt_alone SELECT g FROM generate_series(1, %(n)s) g RETURNING v, pg_backend_pid()", {"n": 2}
    )
    assert [type(r) for r in rows] == [tuple, tuple]
    pid = rows[0][1]
    assert [v for v, _ in rows] == [1, 2]
    with engine.connect() as conn:  # committed as it ended, and the connection is transactional again
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == pid
        assert conn.exec_driver_sql("SELECT count(*) FROM dt_alone").scalar_one() == 2
        assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]
    assert engine_module.execute_alone(engine, "DELETE FROM dt_alone", {}) == []  # no result set: no rows


def test_execute_alone_raises_sqlalchemy_errors_and_discards_the_connection(
    engine: sa.Engine, postgres_url: str
) -> None:
    """Callers treat SQLAlchemyError as an outage: a bad statement and a dead connection both
    come out as one, and the connection they came from never serves again."""
    first = engine_module.execute_alone(engine, "SELECT pg_backend_pid()", {})[0][0]
    with pytest.raises(sa.exc.ProgrammingError):
        engine_module.execute_alone(engine, "SELECT no_such_column FROM pg_class", {})
    second = engine_module.execute_alone(engine, "SELECT pg_backend_pid()", {})[0][0]
    assert second != first
    _terminate_backend(postgres_url, second)
    with pytest.raises(sa.exc.OperationalError) as raised:  # reused at once: no ping, the statement fails
        engine_module.execute_alone(engine, "SELECT 1", {})
    assert raised.value.connection_invalidated
    assert engine_module.execute_alone(engine, "SELECT 1", {}) == [(1,)]  # a new connection


def test_a_runtime_transaction_on_a_dead_connection_raises_a_sqlalchemy_error_and_the_next_one_works(
    engine: sa.Engine, postgres_url: str
) -> None:
    """The runtime's transactions on the pool start with a SET LOCAL (store.engine.runtime_plans);
    on a connection that died it fails as any statement would, with an error of SQLAlchemy's
    family (heartbeats and the reaper treat those as an outage), and the pool replaces it."""
    runtime = engine_module.runtime_plans(engine)
    pid = _backend_pid(runtime)
    _terminate_backend(postgres_url, pid)
    with pytest.raises(sa.exc.OperationalError), runtime.begin() as conn:  # reused at once: no ping
        conn.exec_driver_sql("SELECT 1")
    with runtime.begin() as conn:
        assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "off"
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid
