"""Submitting from plain SQL, as docs/sql-submit.md shows it: ``dt_submit(...)`` through psql
on PostgreSQL, the INSERT pair through the sqlite3 module on SQLite. The rows are those of
App.submit, the idempotency is the same, the caller's rollback writes nothing, and the task
runs to completion. The ids are UUIDv7, as App.submit's: dt_submit's on PostgreSQL and
MySQL/MariaDB, and on SQLite those of the page's SQL."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.migrations import migrate
from durable_tasks.migrations.backends import execute
from durable_tasks.migrations.steps import BACKENDS, load_steps, split_statements
from durable_tasks.records import payloads_table
from tests.helpers import FAST, private_schema, run_until

pytestmark = pytest.mark.anyio
PAGE = Path(__file__).resolve().parents[2] / "docs" / "sql-submit.md"


def sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


class Judge(BaseModel):
    submission_id: int


def judge_app(url: str, redis_url: str, namespace: str, tmp_path: Path) -> App:
    settings: dict[str, Any] = dict(FAST)
    app = App(url, redis_url, namespace, data_dir=tmp_path / "data", **settings)

    @app.task(name="judge", queue="judge")
    def judge(ctx: TaskContext[Judge], p: Judge) -> str:
        return f"judged {p.submission_id}"

    app.create_all()
    return app


async def run_until_settled(app: App, task_ids: list[str]) -> None:
    def settled() -> bool:
        return all(app.get_task(t).state is TaskState.SUCCEEDED for t in task_ids)

    await run_until(app, settled, reaper=False)


def psql(url: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with the psql client on the database (and schema) of ``url``."""
    u = sa.make_url(url)
    host = str(u.query.get("host") or u.host or "127.0.0.1")  # a socket directory for the embedded server
    command = ["psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", str(u.port or 5432)]
    command += ["-U", u.username or "postgres", "-d", u.database or "postgres"]
    env = {"PGOPTIONS": str(u.query.get("options", "")), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    if u.password:
        env["PGPASSWORD"] = u.password
    return subprocess.run(command, input=script, capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.mark.postgres_only
@pytest.mark.usefixtures("clean_redis")
async def test_dt_submit_from_psql_writes_the_rows_of_submit_and_the_task_runs(
    postgres_url: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    if shutil.which("psql") is None:
        pytest.skip("psql (the PostgreSQL client) is not installed")
    with private_schema(postgres_url, "dt_sql") as url:
        app = judge_app(url, redis_url, namespace, tmp_path)
        with app.engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE submissions (id integer PRIMARY KEY, verdict text)"))
        [block] = [b for b in sql_blocks() if "dt_submit(" in b and "SELECT dt_submit" in b]
        script = block.replace("'default'", f"'{namespace}'")

        rolled_back = psql(url, script.replace("COMMIT;", "ROLLBACK;"))
        assert rolled_back.returncode == 0, rolled_back.stderr
        with app.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM dt_tasks")).scalar_one() == 0  # nothing half-written

        done = psql(url, script)
        assert done.returncode == 0, done.stderr
        again = psql(url, f"SELECT dt_submit('{namespace}', 'judge', 'judge', '{{}}', 'submission-42');")
        assert again.returncode == 0, again.stderr
        task_id = done.stdout.strip()
        assert again.stdout.strip() == task_id  # the same key: the same task, nothing written
        bad = psql(url, f"SELECT dt_submit('{namespace}', 'judge', 'judge', 'not json');")
        assert bad.returncode != 0
        assert "invalid input syntax for type json" in bad.stderr
        with app.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM dt_outbox")).scalar_one() == 1
            assert conn.execute(sa.text("SELECT verdict FROM submissions")).scalar_one() == "Pending"

        await run_until_settled(app, [task_id])
        info = app.get_task(task_id)
        assert (info.state, info.result, info.generation) == (TaskState.SUCCEEDED, "judged 42", 0)
        await app.aclose()


def sqlite_submit(
    conn: sqlite3.Connection, namespace: str, key: str | None, payload: str, *, commit: bool = True
) -> str:
    """A ``judge`` task submitted with docs/sql-submit.md's SQLite statements, in a transaction
    of its own on ``conn`` (autocommit mode), committed or rolled back; its id."""
    statements = split_statements(next(b for b in sql_blocks() if b.startswith("-- SQLite: submit")))
    [new_id] = split_statements(next(b for b in sql_blocks() if b.startswith("-- SQLite: a task id")))
    params = {
        "id": conn.execute(new_id).fetchone()[0],
        "namespace": namespace,
        "task": "judge",
        "queue": "judge",
        "payload": payload,
        "idempotency_key": key,
        "max_attempts": 3,
    }
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in statements[:2]:
            conn.execute(statement, params)
        [(task_id,)] = conn.execute(statements[2], params).fetchall()
    except sqlite3.Error:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT" if commit else "ROLLBACK")
    return str(task_id)


@pytest.mark.usefixtures("clean_redis")
async def test_the_sqlite_insert_pair_writes_the_rows_of_submit_and_the_task_runs(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    path = tmp_path / "producer.sqlite3"
    app = judge_app(f"sqlite:///{path}", redis_url, namespace, tmp_path)
    [block] = [b for b in sql_blocks() if b.startswith("-- SQLite: submit")]
    statements = split_statements(block)
    assert len(statements) == 3

    def submit(conn: sqlite3.Connection, key: str | None, payload: str, *, commit: bool = True) -> str:
        return sqlite_submit(conn, namespace, key, payload, commit=commit)

    producer = sqlite3.connect(path, isolation_level=None)
    submit(producer, "submission-7", '{"submission_id": 7}', commit=False)
    first = submit(producer, "submission-7", '{"submission_id": 7}')
    assert submit(producer, "submission-7", '{"submission_id": 7}') == first
    plain = submit(producer, None, '{"submission_id": 8}')
    with pytest.raises(sqlite3.OperationalError, match="malformed JSON"):
        submit(producer, None, "not json")
    assert producer.execute("SELECT count(*) FROM dt_outbox").fetchone() == (2,)
    producer.close()

    await run_until_settled(app, [first, plain])
    assert app.get_task(first).result == "judged 7"
    assert app.get_task(plain).result == "judged 8"
    await app.aclose()


def mysql_client(url: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with the mysql client on the database of ``url``."""
    u = sa.make_url(url)
    command = ["mysql", "--batch", "--skip-column-names", "-h", u.host or "127.0.0.1", "-P", str(u.port or 3306)]
    command += ["-u", u.username or "root", u.database or "test"]
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", **({"MYSQL_PWD": u.password} if u.password else {})}
    return subprocess.run(command, input=script, capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.mark.usefixtures("clean_redis")
async def test_call_dt_submit_from_the_mysql_client_writes_the_rows_of_submit_and_the_task_runs(
    mysql_url: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    if shutil.which("mysql") is None:
        pytest.skip("mysql (the MySQL/MariaDB client) is not installed")
    base = sa.make_url(mysql_url)
    database = f"dt_sql_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4"))
    url = base.set(database=database).render_as_string(hide_password=False)
    try:
        app = judge_app(url, redis_url, namespace, tmp_path)
        with app.engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE submissions (id integer PRIMARY KEY, verdict text)"))
        [block] = [b for b in sql_blocks() if "CALL dt_submit(" in b]
        script = block.replace("'default'", f"'{namespace}'")

        rolled_back = mysql_client(url, script.replace("COMMIT;", "ROLLBACK;"))
        assert rolled_back.returncode == 0, rolled_back.stderr
        with app.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM dt_tasks")).scalar_one() == 0  # nothing half-written

        done = mysql_client(url, script)
        assert done.returncode == 0, done.stderr
        call = f"CALL dt_submit('{namespace}', 'judge', 'judge', '{{}}', 'submission-42', 3, FALSE, NULL, NULL);"
        again = mysql_client(url, call)
        assert again.returncode == 0, again.stderr
        task_id = done.stdout.strip()
        assert again.stdout.strip() == task_id  # the same key: the same task, nothing written
        other_case = mysql_client(
            url, call.replace("submission-42", "SUBMISSION-42").replace("{}", '{"submission_id": 43}')
        )
        assert other_case.stdout.strip() not in ("", task_id)  # keys compare byte for byte
        bad = mysql_client(url, f"CALL dt_submit('{namespace}', 'judge', 'judge', 'not json', NULL, 3, 0, NULL, NULL);")
        assert bad.returncode != 0
        assert "dt_submit: payload must be JSON text" in bad.stderr
        with app.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM dt_outbox")).scalar_one() == 2
            assert conn.execute(sa.text("SELECT verdict FROM submissions")).scalar_one() == "Pending"

        await run_until_settled(app, [task_id, other_case.stdout.strip()])
        info = app.get_task(task_id)
        assert (info.state, info.result, info.generation) == (TaskState.SUCCEEDED, "judged 42", 0)
        await app.aclose()
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE `{database}`"))
        admin.dispose()


# Time-ordered ids: the version and variant of UUIDv7, the database's clock in the first 48 bits.
SUBMIT = {
    "postgres": "SELECT dt_submit('ids', 'probe', 'probe', '{}')",
    "mysql": "CALL dt_submit('ids', 'probe', 'probe', '{}', NULL, 3, FALSE, NULL, NULL)",
}
CLOCK_MS = {
    "postgres": "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    "mysql": "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000",
    "sqlite": "SELECT CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER)",
}


def ids_one_ms_apart(make_id: Callable[[], str], count: int = 5) -> list[str]:
    ids = []
    for _ in range(count):
        ids.append(make_id())
        time.sleep(0.003)  # the next id in a later millisecond
    return ids


def assert_uuid7_near(task_id: str, clock_ms: int) -> None:
    parsed = uuid.UUID(task_id)
    assert str(parsed) == task_id  # lowercase, 36 characters
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert abs((parsed.int >> 80) - clock_ms) < 5_000  # the first 48 bits: Unix ms


def assert_dt_submit_makes_uuid7_ids_in_time_order(engine: sa.Engine) -> None:
    backend = BACKENDS[engine.dialect.name]

    def submit() -> str:
        with engine.begin() as conn:
            return str(conn.exec_driver_sql(SUBMIT[backend]).scalar_one())

    ids = ids_one_ms_apart(submit)
    with engine.connect() as conn:
        clock_ms = conn.exec_driver_sql(CLOCK_MS[backend]).scalar_one()
        written = conn.execute(sa.text("SELECT o.task_id FROM dt_outbox AS o JOIN dt_tasks AS t ON t.id = o.task_id"))
        assert sorted(written.scalars()) == ids  # the rows carry the ids returned
    for task_id in ids:
        assert_uuid7_near(task_id, clock_ms)
    assert sorted(ids) == ids  # text order is time order


@pytest.mark.parametrize("new_database", ["postgres", "mysql"], indirect=True)
def test_dt_submit_makes_uuid7_ids_that_sort_in_time_order(new_database: Callable[[], str]) -> None:
    engine = sa.create_engine(new_database())
    try:
        migrate(engine)
        assert_dt_submit_makes_uuid7_ids_in_time_order(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("new_database", ["mysql"], indirect=True)
def test_on_mariadb_without_random_bytes_dt_submit_still_makes_uuid7_ids(new_database: Callable[[], str]) -> None:
    """MariaDB before 10.10 has no RANDOM_BYTES: the procedure of step 13 with the function
    renamed to one that does not exist is that server's case."""
    [step] = [s for s in load_steps("mysql") if s.name == "dt_submit_v7"]
    assert step.source.count("RANDOM_BYTES(") == 1
    engine = sa.create_engine(new_database())
    try:
        migrate(engine)
        with engine.connect() as conn:
            for statement in split_statements(step.source.replace("RANDOM_BYTES(", "DT_NO_SUCH_FUNCTION(")):
                execute(conn, statement)
            conn.commit()
        assert_dt_submit_makes_uuid7_ids_in_time_order(engine)
    finally:
        engine.dispose()


def test_the_sqlite_id_sql_makes_uuid7_ids_that_sort_in_time_order() -> None:
    [new_id] = split_statements(next(b for b in sql_blocks() if b.startswith("-- SQLite: a task id")))
    conn = sqlite3.connect(":memory:")
    try:
        ids = ids_one_ms_apart(lambda: str(conn.execute(new_id).fetchone()[0]))
        [(clock_ms,)] = conn.execute(CLOCK_MS["sqlite"]).fetchall()
    finally:
        conn.close()
    assert abs(clock_ms - time.time_ns() // 1_000_000) < 1_000  # SQLite's clock is the system's
    for task_id in ids:
        assert_uuid7_near(task_id, clock_ms)
    assert sorted(ids) == ids


def sql_submit(url: str, namespace: str, payload: str) -> str:
    """Submit a ``judge`` task with the SQL of docs/sql-submit.md for the backend of ``url``."""
    if url.startswith("sqlite"):
        producer = sqlite3.connect(sa.make_url(url).database or "", isolation_level=None)
        try:
            return sqlite_submit(producer, namespace, None, payload)
        finally:
            producer.close()
    engine = sa.create_engine(url)
    backend = BACKENDS[engine.dialect.name]
    call = SUBMIT[backend].replace("'ids', 'probe', 'probe', '{}'", ":namespace, 'judge', 'judge', :payload")
    try:
        with engine.begin() as conn:
            return str(conn.execute(sa.text(call), {"namespace": namespace, "payload": payload}).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.usefixtures("clean_redis")
async def test_a_payload_from_sql_that_names_a_key_twice_is_dead_lettered_and_never_runs(
    new_database: Callable[[], str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Reliability plan B7: which of two equal keys a reader takes differs between parsers
    (PostgreSQL's jsonb and pydantic keep the last), so the dispatcher refuses such JSON from a
    producer's SQL with a reason naming the key; every database accepts it as JSON."""
    url = new_database()
    app = App(url, redis_url, namespace, data_dir=tmp_path / "data", **FAST)
    ran: list[int] = []

    @app.task(name="judge", queue="judge")
    def judge(ctx: TaskContext[Judge], p: Judge) -> str:
        ran.append(p.submission_id)
        return f"judged {p.submission_id}"

    app.create_all()
    twice = sql_submit(url, namespace, '{"submission_id": 1, "submission_id": 2}')
    nested = sql_submit(url, namespace, '{"submission_id": 3, "files": [{"name": "a.py", "n\\u0061me": "b.py"}]}')
    clean = sql_submit(url, namespace, '{"submission_id": 4, "files": [{"name": "a.py"}, {"name": "a.py"}]}')

    def settled() -> bool:
        return all(app.get_task(t).state in (TaskState.DEAD, TaskState.SUCCEEDED) for t in (twice, nested, clean))

    await run_until(app, settled, reaper=False)
    for task_id, key in ((twice, "submission_id"), (nested, "name")):
        info = app.get_task(task_id)
        assert (info.state, info.error_type) == (TaskState.DEAD, "InvalidPayload")
        assert f"names the key {key!r} twice" in (info.error_message or "")
    assert app.get_task(clean).result == "judged 4"  # equal values in two objects are not a duplicate
    assert ran == [4]
    await app.aclose()


class Submission(BaseModel):
    submission_id: int
    code: str = ""


@pytest.mark.usefixtures("clean_redis")
def test_the_pages_payload_query_reads_a_payload_wherever_it_is_kept(
    new_database: Callable[[], str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The page's reading of a payload finds it in dt_payloads (App.submit's over 4 KiB on SQLite
    and MySQL) and in dt_tasks (small ones, PostgreSQL's, a SQL submit's of any size)."""
    [query] = split_statements(next(b for b in sql_blocks() if b.startswith("-- A task's payload")))
    url = new_database()
    app = App(url, redis_url, namespace, data_dir=tmp_path / "data", **FAST)

    @app.task(name="judge", queue="judge")
    def judge(ctx: TaskContext[Submission], p: Submission) -> str:
        return f"judged {p.submission_id}"

    app.create_all()
    small, large = Submission(submission_id=1), Submission(submission_id=2, code="x" * 10_000)
    with Session(app.engine) as session:
        ids = [app.submit(session, "judge", payload).id for payload in (small, large)]
        session.commit()
    ids.append(sql_submit(url, namespace, large.model_dump_json()))
    with app.engine.connect() as conn:
        found = [conn.execute(sa.text(query), {"id": task_id}).scalar_one() for task_id in ids]
        apart = conn.execute(sa.select(payloads_table.c.task_id)).scalars().all()
    assert [Submission.model_validate_json(text) for text in found] == [small, large, large]
    assert apart == ([] if app.engine.dialect.name == "postgresql" else [ids[1]])  # the query read there
    app.runtime.store.close()
