"""PostgreSQL: migrators serialize on an advisory lock, and a step outside a transaction
rebuilds an index an interrupted ``CREATE INDEX CONCURRENTLY`` left invalid."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from durable_tasks.migrations import migrate, read_status, runner
from durable_tasks.migrations.backends import LOCK_CLASS
from durable_tasks.migrations.steps import _parse, load_steps
from tests.helpers import private_schema

pytestmark = pytest.mark.postgres_only
SHIPPED = load_steps("postgresql")
LATEST = SHIPPED[-1].version


@pytest.fixture
def schema_url(postgres_url: str) -> Iterator[str]:
    """An empty schema of its own."""
    with private_schema(postgres_url, "dt_mig") as url:
        yield url


def read_line(proc: subprocess.Popen[str], deadline: float) -> str:
    """The next line the process prints, waiting until ``deadline`` (monotonic) at most."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "the process printed nothing in time"
    return proc.stdout.readline()


def test_two_migrate_processes_started_at_once_one_migrates_the_other_waits_and_finds_nothing(
    schema_url: str,
) -> None:
    engine = sa.create_engine(schema_url)
    # An existing database, so that the steps after 1 include a CREATE INDEX CONCURRENTLY outside a
    # transaction, which must not wait on the migrator that waits for the lock.
    migrate(engine, to=1)
    holder = engine.connect()
    # Hold the migrators' lock so that both processes are surely running before either can migrate.
    holder.execute(sa.text(f"SELECT pg_advisory_lock({LOCK_CLASS}, hashtext(current_schema()))"))
    holder.commit()
    command = [sys.executable, "-c", "from durable_tasks.cli import main; main()", "migrate"]
    env = {**os.environ, "DT_DATABASE_URL": schema_url, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in "ab"
    ]
    try:
        deadline = time.monotonic() + 60
        for proc in procs:  # both started, and both found the lock taken
            assert read_line(proc, deadline) == "another process is migrating this database: waiting for it\n"
        holder.execute(sa.text(f"SELECT pg_advisory_unlock({LOCK_CLASS}, hashtext(current_schema()))"))
        holder.commit()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        holder.close()
    assert [p.returncode for p in procs] == [0, 0], outputs
    migrated = [out for out in outputs if f"applied {SHIPPED[-1].label}" in out]
    idle = [out for out in outputs if out.endswith(f"schema at version {LATEST}: nothing to do\n")]
    assert len(migrated) == 1, outputs
    assert len(idle) == 1, outputs
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version FROM dt_migrations ORDER BY version")).scalars().all() == [
            s.version for s in SHIPPED
        ]
    engine.dispose()


def index_validity(conn: sa.Connection, name: str) -> list[bool]:
    return list(
        conn.execute(
            sa.text(
                "SELECT i.indisvalid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
                "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.relname = :n AND n.nspname = current_schema()"
            ),
            {"n": name},
        ).scalars()
    )


def test_a_concurrent_index_step_rebuilds_an_invalid_leftover(schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sa.create_engine(schema_url)
    migrate(engine)
    with engine.begin() as conn:
        first = conn.execute(sa.text("SELECT dt_submit('ns', 'probe', 'same', '{}')")).scalar_one()
        conn.execute(sa.text("SELECT dt_submit('ns', 'probe', 'same', '{}')"))
    with engine.connect() as conn:  # an interrupted build: it fails on the duplicate and stays, INVALID
        conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(sa.text("CREATE UNIQUE INDEX CONCURRENTLY ix_dt_tasks_probe ON dt_tasks (queue)"))
        assert index_validity(conn, "ix_dt_tasks_probe") == [False]
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM dt_outbox WHERE task_id != :id"), {"id": first})
        conn.execute(sa.text("DELETE FROM dt_tasks WHERE id != :id"), {"id": first})

    step = _parse(
        LATEST + 1,
        "probe_index",
        "-- transaction: none\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_tasks_probe ON dt_tasks (queue);\n",
    )
    shipped = runner.steps_for
    monkeypatch.setattr(runner, "steps_for", lambda dialect: (*shipped(dialect), step))
    report = migrate(engine)
    assert [s.label for s in report.applied] == [step.label]
    with engine.connect() as conn:
        assert index_validity(conn, "ix_dt_tasks_probe") == [True]
        assert read_status(conn).version == step.version
    engine.dispose()
