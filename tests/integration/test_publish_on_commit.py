"""A committed submit publishes its task's entry itself (``publish_on_commit``, the default),
ahead of the dispatcher, which still publishes every row: the same dedup key, so the stream
holds one entry and the outbox row records its id. Rows that did not commit publish nothing;
delayed and shadow tasks wait for the dispatcher; a Redis out of reach leaves the commit alone
and the dispatcher publishes. A suspension's children go out the same way once it commits,
and a parent's resume once its last child's result commits.
On every database."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, ChildTaskFailedError, TaskContext, TaskNotFoundError, TaskState, current_journal
from durable_tasks.dispatcher import Dispatcher
from durable_tasks.records import OutboxState
from durable_tasks.transport.keys import QueueKeys
from tests import helpers
from tests.helpers import FAST, entries, keys, outbox_row, submit
from tests.servers import private_redis

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_url", ["postgres", "sqlite", "mysql"], indirect=True),
]

#: A dispatcher that never wakes on its own within a test: what is on a stream, the commit put there.
NO_POLL = {"poll_interval": timedelta(hours=1)}


async def stream_entries(app: App, queue: str = "jobs") -> list[tuple[str, dict[str, str]]]:
    assert app.runtime.wakeups.flush(), "the commit's publish did not finish in 5 s"
    return await entries(app, keys(app, queue).stream)


async def test_the_entry_is_out_at_commit_and_the_dispatcher_adds_none(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, **NO_POLL)
    task_id = submit(app, "double", 21)
    [(entry_id, fields)] = await stream_entries(app)
    assert (fields["t"], fields["g"], fields["d"], fields["n"]) == (task_id, "0", "0", "double")
    assert outbox_row(app, task_id).state == OutboxState.PENDING  # the dispatcher has not run

    assert await app.dispatch_once() == 1  # publishes the row: a dedup hit, the same entry id
    row = outbox_row(app, task_id)
    assert (row.state, row.stream_id) == (OutboxState.SENT, entry_id)
    assert [e for e, _ in await stream_entries(app)] == [entry_id]
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state is TaskState.SUCCEEDED
    await app.aclose()


async def test_a_worker_runs_the_task_before_any_dispatcher_does(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, **NO_POLL)
    task_id = submit(app, "double", 4)
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    done = app.get_task(task_id)
    assert (done.state, done.result) == (TaskState.SUCCEEDED, 8)
    assert outbox_row(app, task_id).state == OutboxState.PENDING
    assert await app.dispatch_once() == 1  # marks the row; the task stays as it is
    assert outbox_row(app, task_id).state == OutboxState.SENT
    assert app.get_task(task_id).state is TaskState.SUCCEEDED
    assert len(await stream_entries(app)) == 1
    await app.aclose()


def parent_app(make_app: Callable[..., App], **settings: Any) -> App:
    app = helpers.doubling_app(make_app, **settings)

    @app.task(name="parent", queue="jobs")
    async def parent(ctx: TaskContext[int], n: int) -> int:
        journal = current_journal()
        assert journal is not None
        return int(await journal.child("double", n)) + 1  # suspends until the child commits

    return app


@pytest.mark.parametrize("publish_on_commit", [True, False])
async def test_a_suspensions_children_and_the_parents_resume_are_out_at_their_commits(
    make_app: Callable[..., App], publish_on_commit: bool
) -> None:
    app = parent_app(make_app, publish_on_commit=publish_on_commit, **NO_POLL)
    parent_id = submit(app, "parent", 4)
    if not publish_on_commit:
        assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1  # runs, then suspends
    assert app.get_task(parent_id).state is TaskState.WAITING
    [child] = [s.child_task_id for s in app.steps(parent_id)]
    assert child is not None
    published = [fields["t"] for _, fields in await stream_entries(app)]
    assert published == [parent_id, child] if publish_on_commit else [parent_id]
    assert outbox_row(app, child).state == OutboxState.PENDING  # no dispatcher has run
    if publish_on_commit:  # the worker starts the child without one, and the parent's resume
        assert await app.work(max_tasks=2, timeout=timedelta(seconds=10)) == 2
        assert app.get_task(child).state is TaskState.SUCCEEDED
        done = app.get_task(parent_id)
        assert (done.state, done.result) == (TaskState.SUCCEEDED, 9)
    assert await app.dispatch_once() >= 1  # its publish adds nothing (the same dedup key)
    deliveries = [(fields["t"], fields["d"]) for _, fields in await stream_entries(app)]
    assert deliveries.count((child, "0")) == 1
    if publish_on_commit:
        assert deliveries.count((parent_id, "1")) == 1  # the resume, once
    await app.aclose()


async def test_a_parent_resumed_by_its_childs_final_failure_is_out_at_that_commit(
    make_app: Callable[..., App],
) -> None:
    app = helpers.doubling_app(make_app, **NO_POLL)

    @app.task(name="refuses", queue="jobs", max_attempts=1)
    def refuses(ctx: TaskContext[int], n: int) -> int:
        raise ValueError(f"no {n}")

    @app.task(name="handles", queue="jobs")
    async def handles(ctx: TaskContext[int], n: int) -> str:
        journal = current_journal()
        assert journal is not None
        try:
            await journal.child("refuses", n)
        except ChildTaskFailedError as exc:
            return f"handled {exc.error_type}"
        return "not reached"

    parent_id = submit(app, "handles", 7)
    # No dispatcher runs: the parent (its submit's commit), the child (the suspension's commit)
    # and the parent's resume (the child's final failure's commit) all go out at their commits.
    assert await app.work(max_tasks=3, timeout=timedelta(seconds=10)) == 3
    done = app.get_task(parent_id)
    assert (done.state, done.result) == (TaskState.SUCCEEDED, "handled ValueError")
    await app.aclose()


async def test_only_committed_rows_are_published(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, **NO_POLL)
    with Session(app.engine) as session:
        app.submit(session, "double", 1)
        session.rollback()
        savepoint = session.begin_nested()
        app.submit(session, "double", 2)
        savepoint.rollback()
        kept = session.begin_nested()
        released = app.submit(session, "double", 3).id
        kept.commit()  # released: its row is the transaction's
        session.commit()
    session = Session(app.engine)
    app.submit(session, "double", 4)
    session.close()  # uncommitted: rolled back
    assert [fields["t"] for _, fields in await stream_entries(app)] == [released]
    await app.aclose()


async def test_a_session_that_joined_an_outer_transaction_publishes_nothing_at_its_commit(
    make_app: Callable[..., App],
) -> None:
    # Its commit releases a savepoint (an on_commit hook's session does this on the fenced
    # transaction): a worker reading an entry now would find no committed task row.
    app = helpers.doubling_app(make_app, **NO_POLL)

    def submit_joined(conn: sa.Connection, n: int) -> str:
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            task_id = app.submit(session, "double", n).id
            session.commit()
        return task_id

    with app.engine.connect() as conn:
        with conn.begin() as outer:
            rolled_back = submit_joined(conn, 1)
            assert await stream_entries(app) == []
            outer.rollback()
        with conn.begin():
            kept = submit_joined(conn, 2)
            assert await stream_entries(app) == []
    assert await app.dispatch_once() == 1  # the dispatcher publishes the row that committed
    assert [fields["t"] for _, fields in await stream_entries(app)] == [kept]
    assert outbox_row(app, kept).state == OutboxState.SENT
    with pytest.raises(TaskNotFoundError):
        app.get_task(rolled_back)
    await app.aclose()


async def test_delayed_and_shadow_tasks_wait_for_the_dispatcher(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, **NO_POLL)
    submit(app, "double", 1, delay=timedelta(hours=1))
    shadow = submit(app, "double", 2, shadow=True)
    assert await stream_entries(app) == []
    assert await entries(app, keys(app).shadow) == []
    assert await app.dispatch_once() == 1  # the shadow task; the delayed one is not due
    [(_, fields)] = await entries(app, keys(app).shadow)
    assert fields["t"] == shadow
    await app.aclose()


async def test_with_the_setting_off_only_the_dispatcher_publishes(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, publish_on_commit=False, **NO_POLL)
    assert Dispatcher(app.runtime).head_start() is None  # it is the way out: a wake-up passes at once
    assert Dispatcher(helpers.doubling_app(make_app).runtime).head_start() is not None
    task_id = submit(app, "double", 5)
    assert await stream_entries(app) == []
    assert await app.dispatch_once() == 1
    [(entry_id, _)] = await stream_entries(app)
    assert outbox_row(app, task_id).stream_id == entry_id
    await app.aclose()


async def test_signed_entries_published_at_commit_run(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, signing_key="k1-" + "x" * 29, **NO_POLL)
    task_id = submit(app, "double", 6)
    [(_, fields)] = await stream_entries(app)
    assert "s" in fields
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state is TaskState.SUCCEEDED  # a forged entry would go to the DLQ
    await app.aclose()


async def test_a_partitioned_queue_gets_the_entry_on_the_dispatchers_partition(
    make_app: Callable[..., App],
) -> None:
    app = helpers.doubling_app(make_app, queue_partitions={"jobs": 4}, **NO_POLL)
    task_ids = [submit(app, "double", i, partition_key=f"user:{i}") for i in range(6)]
    assert app.runtime.wakeups.flush()
    namespace = app.settings.namespace
    before = {p: await entries(app, QueueKeys(namespace, "jobs", p).stream) for p in range(4)}
    assert sum(len(e) for e in before.values()) == 6
    assert await app.dispatch_once() == 6  # each row a dedup hit on the stream it went to
    after = {p: await entries(app, QueueKeys(namespace, "jobs", p).stream) for p in range(4)}
    assert after == before
    published = {(p, fields["t"], e) for p, listed in after.items() for e, fields in listed}
    recorded = {(row.partition, task_id, row.stream_id) for task_id in task_ids for row in [outbox_row(app, task_id)]}
    assert recorded == published
    await app.aclose()


async def test_a_redis_out_of_reach_leaves_the_commit_alone_and_the_dispatcher_publishes(
    make_app: Callable[..., App], database_url: str, namespace: str, tmp_path: Path
) -> None:
    # Nothing listens on port 1: the publish fails at once, after the commit, in another thread.
    cut_off = App(database_url, "redis://127.0.0.1:1/0", namespace, data_dir=tmp_path / "cut", **FAST)
    cut_off.create_all()
    helpers.doubling_app(lambda: cut_off)
    started = time.monotonic()
    task_id = submit(cut_off, "double", 7)
    assert time.monotonic() - started < 5  # the commit did not wait on Redis' timeouts
    assert cut_off.runtime.wakeups.flush()
    app = helpers.doubling_app(make_app, **NO_POLL)  # the same database and namespace, Redis reachable
    assert await stream_entries(app) == []
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state is TaskState.SUCCEEDED
    await app.aclose()
    await cut_off.aclose()


def doubling_app_on(redis_url: str, database_url: str, namespace: str, tmp_path: Path) -> App:
    """The doubling App on the Redis at ``redis_url`` (a private server), no dispatcher polling."""
    app = App(database_url, redis_url, namespace, data_dir=tmp_path / "app", **(FAST | NO_POLL))
    app.create_all()
    return helpers.doubling_app(lambda: app)


def published(server_url: str, app: App) -> list[str]:
    """The task ids on the ``jobs`` stream of the server at ``server_url``, oldest first."""
    reader = redis.Redis.from_url(server_url)  # the App's own clients may have been cut off
    try:
        listed: Any = reader.xrange(keys(app, "jobs").stream)  # redis-py's types allow None here
        return [fields[b"t"].decode() for _, fields in listed]
    finally:
        reader.close()


async def test_a_new_or_restarted_server_gets_the_script_and_the_next_commit_publishes_again(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    """A server that never ran the enqueue script (a new one, or one restarted: its scripts
    are gone) answers NOSCRIPT: the sender loads the script and sends those calls once more.
    A restart also cuts the connection the commits write on: the commit that finds it closed
    hands its entries to the sender, which connects again."""
    with private_redis(tmp_path / "redis") as server:
        app = doubling_app_on(server.url, database_url, namespace, tmp_path)
        first = submit(app, "double", 1)
        assert [f["t"] for _, f in await stream_entries(app)] == [first]  # loaded, then sent again
        second = submit(app, "double", 2)  # written by the committing thread
        assert app.runtime.wakeups.flush()
        assert published(server.url, app) == [first, second]

        server.stop(signal.SIGKILL)
        server.start()  # the same port, no scripts, no entries (no persistence)
        third = submit(app, "double", 3)
        assert app.runtime.wakeups.flush()
        assert published(server.url, app) == [third]
        await app.aclose()


async def test_entries_a_server_refused_are_sent_again_by_the_sender(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    """The commits' writes do not wait for replies: one refused (NOSCRIPT, after a SCRIPT
    FLUSH) is found by the next write or a flush, and what it owed goes to the sender, which
    loads the script and sends it once more."""
    with private_redis(tmp_path / "redis") as server:
        app = doubling_app_on(server.url, database_url, namespace, tmp_path)
        first = submit(app, "double", 1)
        assert app.runtime.wakeups.flush()
        with redis.Redis.from_url(server.url) as client:
            client.script_flush()
        refused = submit(app, "double", 2)  # written; its NOSCRIPT is read by the next write
        after = submit(app, "double", 3)
        assert app.runtime.wakeups.flush()
        assert published(server.url, app) == [first, refused, after]
        await app.aclose()


async def test_a_stopped_server_leaves_the_commits_alone(database_url: str, namespace: str, tmp_path: Path) -> None:
    """A server that stops reading (here SIGSTOP) does not stop a commit: its write goes to the
    socket's buffer; a flush gives up; once the server runs again the entries arrive."""
    with private_redis(tmp_path / "redis") as server:
        app = doubling_app_on(server.url, database_url, namespace, tmp_path)
        first = submit(app, "double", 1)
        assert app.runtime.wakeups.flush()
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            stopped = [submit(app, "double", n) for n in range(2, 5)]
            assert time.monotonic() - started < 5  # no commit waited on the server
            assert not app.runtime.wakeups.flush(timeout=0.3)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert app.runtime.wakeups.flush()
        assert published(server.url, app) == [first, *stopped]
        await app.aclose()


async def test_a_forked_child_publishes_on_a_connection_of_its_own(make_app: Callable[..., App]) -> None:
    """A process that forks after its commits wrote (a preloading server) leaves the
    connection to the parent: the child's commits go through a sender and connection of its
    own (on the parent's it would read the parent's replies), and the parent's writes are
    answered as before."""
    app = helpers.doubling_app(make_app, **NO_POLL)
    first = submit(app, "double", 1)
    assert app.runtime.wakeups.flush()
    second = submit(app, "double", 2)  # written by the committing thread, its reply not read yet
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's outcome is its exit status
        status = 1
        try:
            app.engine.dispose(close=False)  # the parent's database connections stay the parent's
            from_child = submit(app, "double", 3)
            status = 0 if app.runtime.wakeups.flush() and from_child else 1
        finally:
            os._exit(status)
    _, status = await anyio.to_thread.run_sync(os.waitpid, child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    third = submit(app, "double", 4)
    assert app.runtime.wakeups.flush()
    ids = [fields["t"] for _, fields in await stream_entries(app)]
    assert ids[:2] == [first, second]
    assert len(ids) == 4  # the child's among them
    assert ids[3] == third
    await app.aclose()
