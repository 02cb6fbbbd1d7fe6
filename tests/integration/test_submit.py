"""Submit: intent and business row in one transaction; idempotency keys."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Field, Session, SQLModel

from durable_tasks import App, DatabaseUnavailableError, TaskContext, TaskState
from durable_tasks.records import outbox_table, tasks_table
from durable_tasks.store.engine import read_only
from tests.helpers import INNODB_TRX_POLL_S, block_until, innodb_trx_turn

pytestmark = pytest.mark.anyio


class Job(BaseModel):
    n: int


class Order(SQLModel, table=True):
    __tablename__ = "test_orders"
    id: int | None = Field(default=None, primary_key=True)
    ref: str


def counts(app: App) -> tuple[int, int]:
    ns = app.settings.namespace
    with read_only(app.engine).connect() as conn:
        tasks = conn.execute(sa.select(sa.func.count()).where(tasks_table.c.namespace == ns)).scalar_one()
        outbox = conn.execute(sa.select(sa.func.count()).where(outbox_table.c.namespace == ns)).scalar_one()
    return tasks, outbox


def orders(app: App, ref: str) -> int:
    with read_only(app.engine).connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(sa.column("ref") == ref).select_from(sa.table("test_orders"))
            ).scalar_one()
        )


@pytest.fixture
def job_app(make_app: Callable[..., App]) -> App:
    app = make_app()
    Order.metadata.create_all(app.engine, tables=[Order.__table__])  # type: ignore[attr-defined]

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[Job], p: Job) -> int:
        return p.n

    return app


def test_submit_writes_task_outbox_and_business_row_in_one_transaction(job_app: App, namespace: str) -> None:
    with Session(job_app.engine) as s:
        s.add(Order(ref=namespace))
        handle = job_app.submit(s, "job", Job(n=1))
        assert counts(job_app) == (0, 0)  # nothing visible before commit
        s.commit()
    assert counts(job_app) == (1, 1)
    assert orders(job_app, namespace) == 1
    info = job_app.get_task(handle.id)
    assert (info.state, info.generation, info.attempt, info.payload) == (TaskState.PENDING, 0, 0, {"n": 1})


def test_rollback_leaves_nothing(job_app: App, namespace: str) -> None:
    with Session(job_app.engine) as s:
        s.add(Order(ref=namespace))
        job_app.submit(s, "job", {"n": 2})
        s.rollback()
    assert counts(job_app) == (0, 0)
    assert orders(job_app, namespace) == 0


def test_same_idempotency_key_in_one_session_returns_the_same_task(job_app: App) -> None:
    with Session(job_app.engine) as s:
        first = job_app.submit(s, "job", {"n": 1}, idempotency_key="req-1")
        second = job_app.submit(s, "job", {"n": 1}, idempotency_key="req-1")
        s.commit()
    assert first.id == second.id
    assert (first.created, second.created) == (True, False)
    assert counts(job_app) == (1, 1)


def test_same_idempotency_key_after_commit_returns_the_committed_task(job_app: App) -> None:
    with Session(job_app.engine) as s:
        first = job_app.submit(s, "job", {"n": 1}, idempotency_key="req-2")
        s.commit()
    with Session(job_app.engine) as s:
        again = job_app.submit(s, "job", {"n": 1}, idempotency_key="req-2")
        s.commit()
    assert again.id == first.id
    assert not again.created
    assert job_app.get_task(first.id).payload == {"n": 1}
    assert counts(job_app) == (1, 1)
    # the same key with another payload: tests/integration/test_submit_mistakes.py


def test_concurrent_duplicate_submits_end_with_one_task(job_app: App) -> None:
    barrier = threading.Barrier(8)
    handles: list[str] = []
    errors: list[BaseException] = []

    def submit_once() -> None:
        try:
            with Session(job_app.engine) as s:
                barrier.wait()
                handles.append(job_app.submit(s, "job", {"n": 5}, idempotency_key="race").id)
                s.commit()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit_once) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(handles)) == 1
    assert counts(job_app) == (1, 1)


def test_different_names_may_share_an_idempotency_key(job_app: App) -> None:
    @job_app.task(name="other", queue="jobs")
    def other(ctx: TaskContext[Job], p: Job) -> int:
        return 0

    with Session(job_app.engine) as s:
        a = job_app.submit(s, "job", {"n": 1}, idempotency_key="shared")
        b = other.submit(s, {"n": 1}, idempotency_key="shared")
        s.commit()
    assert a.id != b.id


def blocked_by(app: App, holder: Session) -> bool:
    """Whether another transaction waits for a row lock ``holder``'s transaction holds (on
    MySQL, ask no more often than :data:`~tests.helpers.INNODB_TRX_POLL_S`)."""
    conn = holder.connection()
    if app.engine.dialect.name == "postgresql":
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with app.engine.connect() as probe:
            query = "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
            return bool(probe.execute(sa.text(query), {"pid": pid}).scalar_one())
    with innodb_trx_turn(), app.engine.connect() as probe:  # PyMySQL puts the values into the statement's text
        query = (
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE :ns"
        )
        return bool(probe.execute(sa.text(query), {"ns": f"%{app.settings.namespace}%"}).scalar_one())


@pytest.mark.parametrize("database_url", ["postgres", "mysql"], indirect=True)
def test_a_submit_that_waits_for_a_concurrent_duplicate_key_yields_to_it(job_app: App) -> None:
    first = Session(job_app.engine)
    held = job_app.submit(first, "job", {"n": 5}, idempotency_key="late")  # the key, not committed yet
    got: list[str] = []

    def second() -> None:
        with Session(job_app.engine) as s:
            handle = job_app.submit(s, "job", {"n": 5}, idempotency_key="late")
            s.commit()
        got.append(f"{handle.id} {handle.created}")

    thread = threading.Thread(target=second)
    thread.start()
    block_until(
        lambda: blocked_by(job_app, first), what="the second submit waiting on the first's key", poll=INNODB_TRX_POLL_S
    )
    first.commit()
    first.close()
    thread.join(timeout=30)
    assert got == [f"{held.id} False"]  # the second yields: the first's task, nothing written
    assert counts(job_app) == (1, 1)
    assert job_app.get_task(held.id).idempotency_key == "late"


@pytest.mark.parametrize("database_url", ["postgres", "mysql"], indirect=True)
def test_a_batch_that_waits_for_a_concurrent_duplicate_key_yields_to_it(job_app: App) -> None:
    """As a single submit does: the batch's insert waits for the transaction that holds the
    key, then names that task (PostgreSQL reads the key again: its statement's snapshot
    predates that commit; MySQL reads the keys back after its insert)."""
    first = Session(job_app.engine)
    held = job_app.submit(first, "job", {"n": 5}, idempotency_key="late")  # the key, not committed yet
    got: list[tuple[str, bool]] = []

    def second() -> None:
        with Session(job_app.engine) as s:
            handles = job_app.submit_many(s, "job", [({"n": 5}, "late"), ({"n": 6}, "new")])
            s.commit()
        got.extend((h.id, h.created) for h in handles)

    thread = threading.Thread(target=second)
    thread.start()
    block_until(lambda: blocked_by(job_app, first), what="the batch waiting on the first's key", poll=INNODB_TRX_POLL_S)
    first.commit()
    first.close()
    thread.join(timeout=30)
    assert got[0] == (held.id, False)
    assert got[1][1]
    assert counts(job_app) == (2, 2)


def lock_waits(app: App, holder: Session) -> int:
    """How many transactions wait, directly or through another waiter, for ``holder``'s (on
    MySQL: how many of this test's namespace wait for a row lock)."""
    with app.engine.connect() as probe:
        if app.engine.dialect.name == "postgresql":
            pid = holder.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            query = (
                "WITH RECURSIVE waiting AS ("
                " SELECT pid FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
                " UNION SELECT a.pid FROM pg_stat_activity AS a"
                " JOIN waiting AS w ON w.pid = ANY(pg_blocking_pids(a.pid))"
                ") SELECT count(*) FROM waiting"
            )
            return int(probe.execute(sa.text(query), {"pid": pid}).scalar_one())
        query = (
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE :ns"
        )
        with innodb_trx_turn():
            return int(probe.execute(sa.text(query), {"ns": f"%{app.settings.namespace}%"}).scalar_one())


@pytest.mark.parametrize("database_url", ["postgres", "mysql"], indirect=True)
def test_two_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock(job_app: App) -> None:
    """A batch inserts its keys in key order, not in the order given: two batches that share
    keys wait for each other one way only. In the order given, the first batch here held "a"
    and waited for "c" (held by a third transaction) while the second held "b" and waited for
    "a"; once "c" was free the first needed "b", and PostgreSQL aborted one of them as a
    deadlock."""
    holder = Session(job_app.engine)
    job_app.submit(holder, "job", {"n": 3}, idempotency_key="c")  # not committed yet
    got: dict[str, list[tuple[str, bool]]] = {}
    failed: list[BaseException] = []

    def batch(name: str, keys: list[str]) -> None:
        try:
            with Session(job_app.engine) as s:
                handles = job_app.submit_many(s, "job", [({"n": ord(k) - ord("a") + 1}, k) for k in keys])
                s.commit()
            got[name] = [(h.id, h.created) for h in handles]
        except BaseException as exc:  # the deadlock's victim
            failed.append(exc)

    first = threading.Thread(target=batch, args=("first", ["a", "c", "b"]))
    first.start()
    block_until(lambda: lock_waits(job_app, holder) >= 1, what="the first batch waiting for c", poll=INNODB_TRX_POLL_S)
    second = threading.Thread(target=batch, args=("second", ["b", "a"]))
    second.start()
    block_until(lambda: lock_waits(job_app, holder) >= 2, what="the second batch waiting too", poll=INNODB_TRX_POLL_S)
    holder.commit()
    holder.close()
    first.join(timeout=30)
    second.join(timeout=30)
    assert failed == []
    (a_id, a_new), (_, c_new), (b_id, b_new) = got["first"]
    assert (a_new, c_new, b_new) == (True, False, True)
    assert got["second"] == [(b_id, False), (a_id, False)]
    assert counts(job_app) == (3, 3)


@pytest.mark.parametrize("database_url", ["postgres", "mysql"], indirect=True)
def test_a_submit_that_waits_past_the_servers_lock_timeout_says_to_roll_back_and_run_it_again(job_app: App) -> None:
    """The server stops the wait for a key another transaction holds: a typed error that says
    what to do (not "cannot reach the database"), and the transaction keeps nothing of it."""
    with Session(job_app.engine) as first, Session(job_app.engine) as second:
        job_app.submit(first, "job", {"n": 5}, idempotency_key="held")  # not committed yet
        if job_app.engine.dialect.name == "postgresql":
            second.execute(sa.text("SET LOCAL lock_timeout = '50ms'"))
        else:
            second.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 1"))
        try:
            with pytest.raises(DatabaseUnavailableError, match="stopped a statement") as raised:
                job_app.submit(second, "job", {"n": 5}, idempotency_key="held")
        finally:
            second.rollback()
            first.rollback()
    assert "Roll the transaction back and run it again" in str(raised.value)
    assert "Start it" not in str(raised.value)
    assert counts(job_app) == (0, 0)
