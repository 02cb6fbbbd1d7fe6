"""Bad input: every case raises a typed DurableTasksError whose message says what to do, and
leaves nothing half-written, on real PostgreSQL / SQLite and Redis."""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from sqlmodel import Session

from durable_tasks import (
    App,
    BrokerUnavailableError,
    ConfigurationError,
    DatabaseUnavailableError,
    DurableTasksError,
    InvalidFlowControlError,
    InvalidIdempotencyKeyError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    SignalError,
    TaskContext,
    TaskInfo,
    TaskNotFoundError,
    TaskState,
    UnknownTaskError,
)
from durable_tasks.records import OutboxState, outbox_table, tasks_table
from durable_tasks.store.engine import read_only
from tests.helpers import outbox_row, task_row
from tests.servers import PrivateRedis, free_port

pytestmark = pytest.mark.anyio


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: int
    name: str


class Measure(BaseModel):
    value: float


business = sa.MetaData()
orders = sa.Table(
    "test_bad_input_orders",
    business,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("namespace", sa.String(64), nullable=False),
    sa.Column("ref", sa.String(64), nullable=False),
)


@pytest.fixture
async def build(make_app: Callable[..., App]) -> AsyncIterator[Callable[..., App]]:
    """``make_app`` with the tasks of this module registered and the business table created;
    every App built is closed at teardown."""
    made: list[App] = []

    def build_app(**overrides: Any) -> App:
        app = make_app(**overrides)
        made.append(app)
        business.create_all(app.engine)

        @app.task(name="job", queue="jobs")
        def job(ctx: TaskContext[Job], p: Job) -> str:
            return p.name

        @app.task(name="measure", queue="jobs")
        def measure(ctx: TaskContext[Measure], p: Measure) -> float:
            return p.value

        @app.task(name="loose", queue="jobs")
        def loose(ctx: TaskContext[dict[str, Any]], p: dict[str, Any]) -> int:
            return len(p)

        return app

    yield build_app
    for app in made:
        await app.aclose()


def count_rows(conn: sa.Connection, namespace: str) -> tuple[int, int, int]:
    """(dt_tasks, dt_outbox, business orders) rows of the namespace, as ``conn`` sees them."""

    def count(table: sa.Table) -> int:
        return int(conn.execute(sa.select(sa.func.count()).where(table.c.namespace == namespace)).scalar_one())

    return count(tasks_table), count(outbox_table), count(orders)


def committed_rows(app: App) -> tuple[int, int, int]:
    with read_only(app.engine).connect() as conn:
        return count_rows(conn, app.settings.namespace)


# -- submit-time errors --------------------------------------------------------------------


class Opaque:
    """An arbitrary object with no JSON form."""


@dataclass(frozen=True)
class BadSubmit:
    """One way to call submit wrongly, the error it must raise and the advice it must give."""

    error: type[DurableTasksError]
    advice: str
    task: str = "job"
    payload: Any = field(default_factory=lambda: {"user_id": 1, "name": "ok"})
    key: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # submit's keyword arguments


BAD_SUBMITS: dict[str, BadSubmit] = {
    "unknown-task-name": BadSubmit(UnknownTaskError, "registered: ['job', 'loose', 'measure']", task="no.such.task"),
    "missing-field": BadSubmit(PayloadValidationError, "Field required", payload={"user_id": 1}),
    "extra-field": BadSubmit(
        PayloadValidationError, "Extra inputs are not permitted", payload={"user_id": 1, "name": "n", "admin": True}
    ),
    "wrong-typed-field": BadSubmit(
        PayloadValidationError, "does not match its payload type", payload={"user_id": "one", "name": "n"}
    ),
    "nan-in-float-field": BadSubmit(
        PayloadNotSerializableError, "NaN", task="measure", payload={"value": float("nan")}
    ),
    "infinity-in-float-field": BadSubmit(
        PayloadNotSerializableError, "NaN/Infinity", task="measure", payload={"value": float("inf")}
    ),
    "nan-in-untyped-payload": BadSubmit(
        PayloadNotSerializableError, "NaN/Infinity", task="loose", payload={"score": float("nan")}
    ),
    "bytes-in-untyped-payload": BadSubmit(
        PayloadNotSerializableError, "bytes", task="loose", payload={"blob": b"\x00\x01raw"}
    ),
    "object-in-untyped-payload": BadSubmit(
        PayloadNotSerializableError, "custom objects", task="loose", payload={"o": Opaque()}
    ),
    "payload-over-max-payload-bytes": BadSubmit(
        PayloadTooLargeError,
        "store large data elsewhere",
        task="loose",
        payload={"blob": "x" * 2000},
        settings={"max_payload_bytes": 1024},
    ),
    "empty-key": BadSubmit(InvalidIdempotencyKeyError, "pass None or a stable request id", key=""),
    "whitespace-key": BadSubmit(InvalidIdempotencyKeyError, "pass None or a stable request id", key="   "),
    "huge-key": BadSubmit(InvalidIdempotencyKeyError, "hash it", key="k" * 513),
    "very-huge-key": BadSubmit(InvalidIdempotencyKeyError, "hash it", key="k" * 100_000),
    "key-with-newline": BadSubmit(InvalidIdempotencyKeyError, "strip or hash it", key="req-1\nX-Injected: 1"),
    "key-with-nul": BadSubmit(InvalidIdempotencyKeyError, "strip or hash it", key="req\x001"),
    "key-with-escape": BadSubmit(InvalidIdempotencyKeyError, "strip or hash it", key="req\x1b[31m"),
    "key-with-del": BadSubmit(InvalidIdempotencyKeyError, "strip or hash it", key="req\x7f"),
    "key-with-c1-control": BadSubmit(InvalidIdempotencyKeyError, "strip or hash it", key="req\x85next-line"),
    # what surrogateescape makes of bytes that are not UTF-8 (a file name, a program's output)
    "lone-surrogate-in-payload": BadSubmit(
        PayloadNotSerializableError, "errors='replace'", task="loose", payload={"stdout": "out\udcff"}
    ),
    "key-with-lone-surrogate": BadSubmit(InvalidIdempotencyKeyError, "errors='replace'", key="req\udcff"),
    "partition-key-with-nul": BadSubmit(
        InvalidFlowControlError, "printable string", options={"partition_key": "p\x00"}
    ),
    "partition-key-with-lone-surrogate": BadSubmit(
        InvalidFlowControlError, "printable string", options={"partition_key": "p\udcff"}
    ),
    "partition-key-over-its-column": BadSubmit(
        InvalidFlowControlError, "1-200 characters", options={"partition_key": "p" * 201}
    ),
    "empty-partition-key": BadSubmit(InvalidFlowControlError, "printable string", options={"partition_key": ""}),
}


@pytest.mark.parametrize("case", BAD_SUBMITS.values(), ids=BAD_SUBMITS.keys())
async def test_bad_submit_writes_nothing_and_rollback_discards_the_business_row(
    build: Callable[..., App], namespace: str, case: BadSubmit
) -> None:
    app = build(**case.settings)
    with Session(app.engine) as session:
        session.connection().execute(sa.insert(orders).values(namespace=namespace, ref="order-1"))
        with pytest.raises(case.error) as exc_info:
            app.submit(session, case.task, case.payload, idempotency_key=case.key, **case.options)
        assert case.advice in str(exc_info.value)
        # Nothing half-written, not even inside the caller's still-open transaction.
        assert count_rows(session.connection(), namespace) == (0, 0, 1)
        session.rollback()
    assert committed_rows(app) == (0, 0, 0)


@pytest.mark.parametrize("case", BAD_SUBMITS.values(), ids=BAD_SUBMITS.keys())
async def test_session_stays_usable_after_a_bad_submit(
    build: Callable[..., App], namespace: str, case: BadSubmit
) -> None:
    app = build(**case.settings)
    with Session(app.engine) as session:
        session.connection().execute(sa.insert(orders).values(namespace=namespace, ref="order-1"))
        with pytest.raises(case.error):
            app.submit(session, case.task, case.payload, idempotency_key=case.key, **case.options)
        handle = app.submit(session, "job", {"user_id": 2, "name": "fine"}, idempotency_key="good-key")
        session.commit()
    assert committed_rows(app) == (1, 1, 1)
    info = app.get_task(handle.id)
    assert (info.name, info.state, info.payload, info.idempotency_key) == (
        "job",
        TaskState.PENDING,
        {"user_id": 2, "name": "fine"},
        "good-key",
    )


async def test_key_length_setting_cannot_exceed_what_the_database_stores(build: Callable[..., App]) -> None:
    """A raised ``max_idempotency_key_length`` is either refused up front or honoured: a key it
    allows must be stored, not fail inside the caller's transaction with a raw driver error."""
    try:
        app = build(max_idempotency_key_length=1000)
    except ConfigurationError:
        return
    key = "k" * 600
    with Session(app.engine) as session:
        first = app.submit(session, "job", {"user_id": 1, "name": "n"}, idempotency_key=key)
        session.commit()
    with Session(app.engine) as session:
        again = app.submit(session, "job", {"user_id": 1, "name": "n"}, idempotency_key=key)
        session.commit()
    assert (again.id, again.created) == (first.id, False)
    assert app.get_task(first.id).idempotency_key == key


# -- configuration errors ------------------------------------------------------------------


@pytest.mark.parametrize("namespace_value", ["a{b}", "a}b", "a:b", "a b", "", "n" * 65, "a\nb", "ns/x", "*"])
def test_namespace_that_would_break_the_key_layout_is_refused(namespace_value: str) -> None:
    with pytest.raises(ConfigurationError) as exc_info:
        App(namespace=namespace_value)
    assert "namespace must be 1-64 characters of letters, digits" in str(exc_info.value)


@pytest.fixture
async def offline_app(tmp_path: Path) -> AsyncIterator[App]:
    """An App that never connects: registering tasks needs no server."""
    app = App(f"sqlite:///{tmp_path / 'unused.sqlite3'}", "redis://127.0.0.1:1", "offline", data_dir=tmp_path)
    yield app
    await app.aclose()


@pytest.mark.parametrize("queue", ["a{b}", "q}", "jobs:high", "with space", "", "q" * 65, "q\n"])
async def test_queue_name_that_would_break_the_key_layout_is_refused(offline_app: App, queue: str) -> None:
    app = offline_app
    with pytest.raises(ConfigurationError) as exc_info:

        @app.task(name="job", queue=queue)
        def job(ctx: TaskContext[Job], p: Job) -> None:
            return None

    assert f"queue name {queue!r} must match" in str(exc_info.value)
    assert app.registry == {}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"timeout": timedelta(0)}, "timeout=datetime.timedelta(0) must be a timedelta over zero"),
        ({"timeout": timedelta(seconds=-5)}, "must be a timedelta over zero"),
        ({"timeout": 30}, "timeout=30 must be a timedelta over zero"),  # seconds as a number: which unit?
        ({"retry_on": ValueError}, "retry_on=<class 'ValueError'> must be a tuple of exception classes"),
        ({"retry_on": ("ValueError",)}, "must be a tuple of exception classes"),
    ],
)
async def test_a_timeout_or_retry_on_no_attempt_could_use_is_refused_at_registration(
    offline_app: App, options: dict[str, object], says: str
) -> None:
    """Not when a worker first runs the task (a zero timeout cancelled every attempt; a bare
    exception class failed the retry decision)."""
    app = offline_app
    with pytest.raises(ConfigurationError, match=re.escape(says)):

        @app.task(name="job", **options)  # type: ignore[arg-type]
        def job(ctx: TaskContext[Job], p: Job) -> None:
            return None

    assert app.registry == {}


async def test_duplicate_task_name_is_refused_and_the_first_registration_kept(offline_app: App) -> None:
    app = offline_app

    @app.task(name="job")
    def first(ctx: TaskContext[Job], p: Job) -> None:
        return None

    with pytest.raises(ConfigurationError) as exc_info:

        @app.task(name="job", queue="other")
        def second(ctx: TaskContext[Job], p: Job) -> None:
            return None

    message = str(exc_info.value)
    assert "'job' is already registered" in message
    assert "name=" in message, f"the message should say how to register it under another name: {message!r}"
    assert app.registry["job"].fn is first.fn
    assert app.runtime.queues() == ["default"]


@pytest.mark.parametrize(
    "name", ["n" * 201, "a\x00b", "a\udcffb", "a\nb"], ids=["over-the-column", "nul", "lone-surrogate", "newline"]
)
async def test_a_task_name_no_database_stores_alike_is_refused_at_registration(offline_app: App, name: str) -> None:
    """Longer than its column, or not printable text (PostgreSQL refuses a NUL, UTF-8 a lone
    surrogate): refused when registered, not at the first submit with a driver's error."""
    app = offline_app

    with pytest.raises(ConfigurationError, match="printable, 1-200 characters"):

        @app.task(name=name)
        def job(ctx: TaskContext[Job], p: Job) -> None:
            return None

    assert app.registry == {}


# -- servers that cannot be reached --------------------------------------------------------


@pytest.fixture(
    params=["postgresql+psycopg://nobody:s3cret-pw@127.0.0.1:1/x", "sqlite:////nonexistent-dt-dir/sub/dt.sqlite3"],
    ids=["postgres-port-1", "sqlite-missing-dir"],
)
async def unreachable_db_app(
    request: pytest.FixtureRequest, redis_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[App]:
    app = App(request.param, redis_url, namespace, data_dir=tmp_path / "data")
    yield app
    await app.aclose()


async def test_unreachable_database_at_start_is_reported(unreachable_db_app: App) -> None:
    app = unreachable_db_app
    with pytest.raises(DatabaseUnavailableError) as exc_info:
        await app.check_connections()
    message = str(exc_info.value)
    assert "point DT_DATABASE_URL at one" in message
    assert "s3cret-pw" not in message

    with pytest.raises(DatabaseUnavailableError) as create_info:
        app.create_all()
    assert "point DT_DATABASE_URL at one" in str(create_info.value)
    assert "s3cret-pw" not in str(create_info.value)


async def test_submit_against_an_unreachable_database_is_a_typed_error(unreachable_db_app: App) -> None:
    app = unreachable_db_app

    @app.task(name="job")
    def job(ctx: TaskContext[Job], p: Job) -> None:
        return None

    with Session(app.engine) as session, pytest.raises(DatabaseUnavailableError):
        job.submit(session, Job(user_id=1, name="n"))


async def test_every_call_against_an_unreachable_database_raises_the_librarys_error(unreachable_db_app: App) -> None:
    """rerun, cancel, get_task, prune and stats: DatabaseUnavailableError, never SQLAlchemy's."""
    app = unreachable_db_app
    calls: dict[str, Callable[[], object]] = {
        "get_task": lambda: app.get_task("some-task"),
        "prune": lambda: app.prune(timedelta(days=1)),
    }
    for name, call in calls.items():
        with pytest.raises(DatabaseUnavailableError) as raised:
            call()
        assert "point DT_DATABASE_URL at one" in str(raised.value), name
        assert "s3cret-pw" not in str(raised.value), name
    for act in (app.rerun, app.cancel):
        with Session(app.engine) as session, pytest.raises(DatabaseUnavailableError):
            act(session, "some-task")
    with pytest.raises(DatabaseUnavailableError):
        await app.stats()


#: What cannot be a task id (ids are 36 printable characters): a NUL byte (PostgreSQL refuses it
#: in text, which must not read as an outage), a lone surrogate (no UTF-8 form), a string too
#: long, none.
NOT_TASK_IDS = {"nul": "01a2\x00b", "lone-surrogate": "01a2\udcffb", "too-long": "x" * 37, "empty": ""}


@pytest.mark.parametrize("task_id", NOT_TASK_IDS.values(), ids=NOT_TASK_IDS.keys())
async def test_what_cannot_be_a_task_id_names_no_task_on_every_call(build: Callable[..., App], task_id: str) -> None:
    app = build()
    calls: dict[str, Callable[[], object]] = {
        "get_task": lambda: app.get_task(task_id),
        "steps": lambda: app.steps(task_id),
        "signal": lambda: app.signal(task_id, "answer", 1),
        "handle": lambda: app.handle(task_id),
    }
    for name, call in calls.items():
        with pytest.raises(TaskNotFoundError, match="no task") as raised:
            call()
        assert "\n" not in str(raised.value), name
    for act in (app.rerun, app.cancel):
        with Session(app.engine) as session, pytest.raises(TaskNotFoundError):
            act(session, task_id)


@pytest.mark.parametrize(
    "name",
    ["", "n\x00m", "n\udcffm", "tab\tname", "x" * 201],
    ids=["empty", "nul", "lone-surrogate", "tab", "too-long"],
)
async def test_a_signal_name_that_is_not_printable_text_is_refused_before_anything_is_read(
    build: Callable[..., App], name: str
) -> None:
    app = build()
    with Session(app.engine) as session:
        handle = app.submit(session, "job", {"user_id": 1, "name": "n"})
        session.commit()
    with pytest.raises(SignalError, match="pass a printable string of 1-200 characters"):
        app.signal(handle.id, name, 1)
    assert app.steps(handle.id) == []  # no slot was written


async def test_a_database_without_the_runtimes_tables_says_to_create_them(tmp_path: Path, redis_url: str) -> None:
    app = App(f"sqlite:///{tmp_path / 'empty.sqlite3'}", redis_url, "no-tables", data_dir=tmp_path / "data")
    try:
        with pytest.raises(DatabaseUnavailableError, match="durable-tasks init-db"):
            app.get_task("some-task")
        with Session(app.engine) as session, pytest.raises(DatabaseUnavailableError, match="init-db"):
            app.rerun(session, "some-task")
    finally:
        await app.aclose()


async def test_stats_against_an_unreachable_redis_raise_the_librarys_error(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    app = App(database_url, "redis://127.0.0.1:1", namespace, data_dir=tmp_path / "data")

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[Job], p: Job) -> None:
        return None

    try:
        app.create_all()
        with pytest.raises(BrokerUnavailableError, match="point DT_REDIS_URL at one"):
            await app.stats()
    finally:
        await app.aclose()


async def test_unreachable_redis_at_start_is_reported(database_url: str, namespace: str, tmp_path: Path) -> None:
    app = App(database_url, "redis://127.0.0.1:1", namespace, data_dir=tmp_path / "data")
    try:
        app.create_all()  # the database is fine
        with pytest.raises(BrokerUnavailableError) as exc_info:
            await app.check_connections()
        message = str(exc_info.value)
        assert "redis://127.0.0.1:1" in message
        assert "point DT_REDIS_URL at one" in message
    finally:
        await app.aclose()


# -- errors found after the submit -------------------------------------------------------


async def run_one(app: App, task: str) -> TaskInfo:
    """Submit one ``task`` with a Job, run it once, and read it back."""
    with Session(app.engine) as session:
        handle = app.submit(session, task, Job(user_id=1, name="n"))
        session.commit()
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=30)) == 1
    return app.get_task(handle.id)


@dataclass(frozen=True)
class BadResult:
    value: Any
    typed: bool  # whether the handler declares ``-> float`` (else it returns Any)


BAD_RESULTS = {
    "object": BadResult(Opaque(), typed=False),
    "nan-declared-float": BadResult(float("nan"), typed=True),
    "nan-untyped": BadResult(float("nan"), typed=False),
    "bytes-untyped": BadResult(b"raw", typed=False),
    "lone-surrogate": BadResult("out\udcff", typed=False),  # bytes decoded with surrogateescape
}


@pytest.mark.parametrize("case", BAD_RESULTS.values(), ids=BAD_RESULTS.keys())
async def test_non_serializable_result_fails_the_task_without_retry(app: App, case: BadResult) -> None:
    if case.typed:

        @app.task(name="bad", queue="results", max_attempts=3)
        def bad_typed(ctx: TaskContext[Job], p: Job) -> float:
            return float(case.value)

    else:

        @app.task(name="bad", queue="results", max_attempts=3)
        def bad_untyped(ctx: TaskContext[Job], p: Job) -> Any:
            return case.value

    info = await run_one(app, "bad")
    assert info.state == TaskState.FAILED
    assert info.error_type == "ResultNotSerializableError"
    assert info.result is None
    assert info.attempt == 1
    assert [(a.outcome, a.error_type) for a in info.attempts] == [("failed", "ResultNotSerializableError")]
    # No retry was scheduled: the only outbox row is the original, already sent.
    with read_only(app.engine).connect() as conn:
        states = conn.execute(sa.select(outbox_table.c.state).where(outbox_table.c.task_id == info.id)).all()
    assert [s.state for s in states] == [OutboxState.SENT]
    assert await app.dispatch_once() == 0


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot say what it is")


#: Exceptions a judge raises with a judged program's output in them: a NUL byte (PostgreSQL
#: refuses it in text), a lone surrogate (what surrogateescape makes of bytes that are not
#: UTF-8), and one whose str() raises. None may keep its failure from being recorded: the task
#: would be redelivered until dead-lettered, with nothing said.
AWKWARD_ERRORS: dict[str, tuple[Callable[[], Exception], str]] = {
    "nul": (lambda: ValueError("stderr: a\x00b"), "stderr: a\\x00b"),
    "lone-surrogate": (lambda: ValueError("stdout: out\udcff"), "stdout: out\\udcff"),
    "str-raises": (UnprintableError, "<UnprintableError: str() raised RuntimeError>"),
}


@pytest.mark.parametrize("case", AWKWARD_ERRORS.values(), ids=AWKWARD_ERRORS.keys())
async def test_a_failure_whose_message_no_database_stores_as_it_is_is_recorded_escaped(
    app: App, case: tuple[Callable[[], Exception], str]
) -> None:
    make_error, recorded = case

    @app.task(name="judge", queue="results", max_attempts=1)
    def judge(ctx: TaskContext[Job], p: Job) -> None:
        raise make_error()

    info = await run_one(app, "judge")
    assert (info.state, info.attempt, info.error_message) == (TaskState.FAILED, 1, recorded)
    assert [a.outcome for a in info.attempts] == ["failed"]


async def stream_length(redis_url: str, key: str) -> int:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return int(await client.xlen(key))
    finally:
        await client.aclose()


def submit_and_tamper(app: App, **column_values: str) -> str:
    """Submit, then edit the committed task row. The Apps of these tests do not publish at
    commit (``publish_on_commit=False``), so the dispatcher sees the edited row first, as it
    sees a row written by SQL; an entry already out at commit fails at the worker's decode
    instead (test_faulty_inputs.py)."""
    with Session(app.engine) as session:
        handle = app.submit(session, "job", Job(user_id=1, name="n"))
        session.commit()
    with app.engine.begin() as conn:
        conn.execute(sa.update(tasks_table).where(tasks_table.c.id == handle.id).values(**column_values))
    return handle.id


@pytest.mark.parametrize(
    "stored",
    ['{"x":', '{"user_id": "one", "name": "n"}', '{"user_id": 1}', '{"user_id": 1, "name": "n", "admin": true}', "[]"],
    ids=["truncated-json", "wrong-type", "missing-field", "extra-field", "not-an-object"],
)
async def test_stored_payload_edited_to_nonsense_is_dead_with_the_reason(
    build: Callable[..., App], redis_url: str, namespace: str, stored: str
) -> None:
    app = build(publish_on_commit=False)
    task_id = submit_and_tamper(app, payload=stored)

    assert await app.dispatch_once() == 1

    outbox = outbox_row(app, task_id)
    task = task_row(app, task_id)
    assert outbox.state == OutboxState.DEAD
    assert "stored payload of task 'job' no longer validates" in outbox.last_error
    assert outbox.stream_id is None
    assert task.state == TaskState.DEAD
    assert task.error_message == outbox.last_error
    assert task.finished_at is not None
    assert await stream_length(redis_url, f"dt:{{{namespace}:jobs}}:stream") == 0
    assert await app.dispatch_once() == 0  # never retried


async def test_operator_can_read_a_task_whose_stored_payload_is_corrupt(build: Callable[..., App]) -> None:
    app = build(publish_on_commit=False)
    task_id = submit_and_tamper(app, payload='{"x":')
    assert await app.dispatch_once() == 1
    info = app.get_task(task_id)
    assert info.state == TaskState.DEAD
    assert info.error_message is not None
    assert "no longer validates" in info.error_message


async def test_task_name_still_unknown_after_the_grace_is_dead_with_the_reason(
    build: Callable[..., App], redis_url: str, namespace: str
) -> None:
    app = build(unknown_task_grace=timedelta(0), publish_on_commit=False)  # test_unknown_tasks.py: the hold
    task_id = submit_and_tamper(app, name="gone")

    assert await app.dispatch_once() == 1

    outbox = outbox_row(app, task_id)
    task = task_row(app, task_id)
    assert outbox.state == OutboxState.DEAD
    assert "unknown task name 'gone'" in outbox.last_error
    assert task.state == TaskState.DEAD
    assert "unknown task name 'gone'" in task.error_message
    assert await stream_length(redis_url, f"dt:{{{namespace}:jobs}}:stream") == 0
    assert await app.dispatch_once() == 0


async def test_one_bad_row_does_not_hold_back_the_good_ones(
    build: Callable[..., App], redis_url: str, namespace: str
) -> None:
    app = build(publish_on_commit=False)
    bad = submit_and_tamper(app, payload='{"x":')
    with Session(app.engine) as session:
        good = app.submit(session, "job", Job(user_id=2, name="fine"))
        session.commit()

    assert await app.dispatch_once() == 2

    assert task_row(app, bad).state == TaskState.DEAD
    assert outbox_row(app, good.id).state == OutboxState.SENT
    assert task_row(app, good.id).state == TaskState.ENQUEUED
    assert await stream_length(redis_url, f"dt:{{{namespace}:jobs}}:stream") == 1


async def test_a_start_waits_for_a_redis_that_comes_up_within_the_startup_wait(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    server = PrivateRedis(free_port(), tmp_path / "late-redis", ())
    app = App(database_url, server.url, namespace, data_dir=tmp_path / "data")
    starter = threading.Timer(1.0, server.start)  # the server comes up while the start waits
    try:
        app.create_all()
        with pytest.raises(BrokerUnavailableError):
            await app.check_connections()  # no wait: refused at once
        starter.start()
        await app.check_connections(wait=timedelta(seconds=20))  # keeps trying, then succeeds
        assert await app.runtime.transport().client.ping()
    finally:
        starter.cancel()
        starter.join()
        await app.aclose()
        server.stop(signal.SIGKILL)
