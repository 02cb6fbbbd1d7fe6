"""Migrators racing on one database, on every backend: two ``durable-tasks migrate`` processes
released together on a fresh database both succeed, each step is applied once, and the schema
ends at the latest version. On PostgreSQL and MySQL/MariaDB the migrators' lock is held by the
migrating session through every step and released when ``migrate`` ends, by an error too."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from durable_tasks.migrations import SchemaStatus, migrate, read_status, runner
from durable_tasks.migrations.backends import LOCK_CLASS, MySqlBackend, execute
from durable_tasks.migrations.steps import Step, _parse, load_steps

SHIPPED = load_steps("sqlite")  # the same numbers and names on every backend
LATEST = SHIPPED[-1].version
WAITING = "another process is migrating this database: waiting for it"

#: ``durable-tasks migrate`` once the file ``argv[1]`` exists; it says "ready" before waiting for
#: it, and "migrating" once it holds the lock and has read the database's version, where it
#: stops until the file ``argv[2]`` exists (so the other process surely meets it migrating).
MIGRATOR = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from durable_tasks.cli import main
    from durable_tasks.migrations import runner

    start, go_on = Path(sys.argv[1]), Path(sys.argv[2])
    apply_steps = runner.apply_steps

    def paused(*args, **kwargs):
        print("migrating", flush=True)
        while not go_on.exists():
            time.sleep(0.01)  # polls for the file: waits on a condition
        return apply_steps(*args, **kwargs)

    runner.apply_steps = paused
    print("ready", flush=True)
    while not start.exists():
        time.sleep(0.005)  # polls for the file: waits on a condition
    sys.argv = ["durable-tasks", "migrate"]
    main()
    """
)


def next_line(proc: subprocess.Popen[str], deadline: float) -> str:
    """The next line ``proc`` prints, waiting until ``deadline`` (monotonic) at most."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "the process printed nothing in time"
    return proc.stdout.readline().rstrip("\n")


def applied_versions(url: str) -> list[int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT version FROM dt_migrations ORDER BY version")).scalars())
    finally:
        engine.dispose()


def test_two_migrate_processes_released_together_on_a_fresh_database_apply_each_step_once(
    new_database: Callable[[], str], tmp_path: Path
) -> None:
    url = new_database()
    start, go_on = tmp_path / "start", tmp_path / "go-on"
    env = {**os.environ, "DT_DATABASE_URL": url, "DT_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("DT_REDIS_URL", None)
    command = [sys.executable, "-c", MIGRATOR, str(start), str(go_on)]
    procs = [
        subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in "ab"
    ]
    try:
        deadline = time.monotonic() + 60
        assert [next_line(p, deadline) for p in procs] == ["ready", "ready"]
        start.touch()
        # Both are in migrate at once: one migrating and the other waiting for its lock, or (SQLite,
        # whose migrators serialize on each step's write lock) both migrating.
        met = sorted(next_line(p, deadline) for p in procs)
        assert met in (sorted(["migrating", WAITING]), ["migrating", "migrating"]), met
        go_on.touch()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    lines = [line for out in outputs for line in out.splitlines()]
    applied = Counter(line.split()[1] for line in lines if line.startswith("applied "))
    assert applied == Counter(step.label for step in SHIPPED), outputs  # each step once, by either
    # Each ends at the latest version; one that applied no step says so. (On SQLite the two can
    # split the steps between them, and then neither says "nothing to do".)
    for out in outputs:
        ends = [line for line in out.splitlines() if line.startswith("schema at version")]
        did_nothing = not any(line.startswith("applied ") for line in out.splitlines())
        assert ends == [f"schema at version {LATEST}" + (": nothing to do" if did_nothing else "")], outputs
    assert applied_versions(url) == [step.version for step in SHIPPED]


@pytest.fixture
def locked_backend(new_database: Callable[[], str]) -> Iterator[tuple[sa.Engine, Callable[[], bool]]]:
    """A fresh database's engine, and whether another session finds its migrators' lock taken."""
    url = new_database()
    engine = sa.create_engine(url)
    observer = sa.create_engine(url, poolclass=sa.pool.NullPool)

    def lock_taken() -> bool:
        with observer.connect() as conn:
            if conn.dialect.name == "postgresql":
                key = f"{LOCK_CLASS}, hashtext(current_schema())"
                got = conn.execute(sa.text(f"SELECT pg_try_advisory_lock({key})")).scalar_one()
                if got:
                    conn.execute(sa.text(f"SELECT pg_advisory_unlock({key})"))
                return not got
            free = conn.execute(sa.text(f"SELECT IS_FREE_LOCK({MySqlBackend.LOCK_NAME})")).scalar_one()
            return not free

    yield engine, lock_taken
    engine.dispose()
    observer.dispose()


def with_steps(monkeypatch: pytest.MonkeyPatch, *extra: Step) -> None:
    """The shipped steps and then ``extra``."""
    shipped = runner.steps_for
    monkeypatch.setattr(runner, "steps_for", lambda dialect: (*shipped(dialect), *extra))


@pytest.mark.parametrize("new_database", ["postgres", "mysql"], indirect=True)
def test_the_migrators_lock_is_held_through_every_step_and_released_at_the_end(
    locked_backend: tuple[sa.Engine, Callable[[], bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, lock_taken = locked_backend
    seen: list[bool] = []
    record = runner._record

    def checked_execute(conn: sa.Connection, statement: str) -> None:
        seen.append(lock_taken())
        execute(conn, statement)

    def checked_record(conn: sa.Connection, step: Step, *, name: str | None = None) -> None:
        seen.append(lock_taken())
        record(conn, step, name=name)

    monkeypatch.setattr(runner, "execute", checked_execute)
    monkeypatch.setattr(runner, "_record", checked_record)
    assert not lock_taken()
    assert migrate(engine).after == LATEST  # a fresh database: every step in a transaction
    statements = sum(len(step.statements) for step in runner.steps_for(engine.dialect))
    assert len(seen) == statements + LATEST  # every statement and every version row
    assert not lock_taken()
    # An existing database: a step outside a transaction, through autocommit and back.
    outside = _parse(
        LATEST + 1, "outside", "-- transaction: none\nCREATE INDEX ix_dt_race_probe ON dt_tasks (queue);\n"
    )
    with_steps(monkeypatch, outside)
    assert migrate(engine).after == outside.version
    assert len(seen) == statements + LATEST + 2
    assert all(seen)
    assert not lock_taken()


@pytest.mark.parametrize("new_database", ["postgres", "mysql"], indirect=True)
@pytest.mark.parametrize("where", ["in a step's transaction", "in a step outside a transaction", "reading the version"])
def test_a_database_error_while_migrating_releases_the_migrators_lock(
    locked_backend: tuple[sa.Engine, Callable[[], bool]], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    engine, lock_taken = locked_backend
    migrate(engine)  # an existing database: a step without a transaction runs outside one
    broken_sql = "SELECT no_such_column FROM dt_tasks"
    if where == "reading the version":  # outside any step: PostgreSQL's transaction is left aborted
        read = runner.read_status

        def broken_read(conn: sa.Connection) -> SchemaStatus:
            status = read(conn)
            conn.execute(sa.text(broken_sql))
            return status

        monkeypatch.setattr(runner, "read_status", broken_read)
    else:
        header = "" if where == "in a step's transaction" else "-- transaction: none\n"
        with_steps(monkeypatch, _parse(LATEST + 1, "broken", f"{header}{broken_sql};\n"))
    with pytest.raises(sa.exc.DBAPIError, match="no_such_column"):
        migrate(engine)
    assert not lock_taken()
    with engine.connect() as conn:
        assert read_status(conn).version == LATEST  # the shipped steps stay applied
    monkeypatch.undo()
    assert migrate(engine).applied == []  # another run takes the lock again, in the same pool


@pytest.mark.parametrize("new_database", ["mysql"], indirect=True)
def test_the_migrators_lock_name_fits_mysql_for_a_database_name_of_the_longest_length(
    new_database: Callable[[], str],
) -> None:
    url = sa.make_url(new_database())
    longest = "dt_" + "n" * 61  # MySQL's limit for a database name, and for a lock name: 64
    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{longest}`")
    try:
        engine = sa.create_engine(url.set(database=longest), poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            name = conn.execute(sa.text(f"SELECT {MySqlBackend.LOCK_NAME}")).scalar_one()
        engine.dispose()
        assert name.startswith("dt_migrate:")
        assert len(name) <= 64, name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE `{longest}`")
        admin.dispose()
