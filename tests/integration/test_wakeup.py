"""Where the database has no notification of its own (MySQL/MariaDB, SQLite), a committed
submit wakes the dispatchers through Redis: a dispatcher polling once an hour publishes the
task at once. Rows rolled back (a transaction, a savepoint, a session closed uncommitted)
publish nothing, and a wake-up that cannot reach Redis leaves the commit alone (the
dispatchers poll)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskState
from durable_tasks.transport.keys import wake_channel
from tests import helpers
from tests.helpers import FAST, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite", "mysql"], indirect=True)]


def doubling_app(make_app: Callable[..., App]) -> App:
    # Polling once an hour: only a wake-up can end a dispatcher's wait.
    return helpers.doubling_app(make_app, poll_interval=timedelta(hours=1))


async def test_a_committed_submit_wakes_a_dispatcher_that_polls_once_an_hour(
    make_app: Callable[..., App], redis_url: str
) -> None:
    app = doubling_app(make_app)
    channel = wake_channel(app.settings.namespace)
    client = redis.Redis.from_url(redis_url)

    def dispatcher_listens() -> bool:
        return bool(client.pubsub_numsub(channel)[0][1])

    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, reaper=False, stop=stop))
        await wait_until(dispatcher_listens, what="the dispatcher's wake-up subscription")
        with Session(app.engine) as session:
            handle = app.submit(session, "double", 21)
            session.commit()
        await wait_until(lambda: app.get_task(handle.id).state is TaskState.SUCCEEDED, what="the woken dispatch")
        stop.set()
    client.close()
    await app.aclose()


async def test_only_a_commit_publishes_a_wake_up(make_app: Callable[..., App], redis_url: str) -> None:
    app = doubling_app(make_app)
    channel = wake_channel(app.settings.namespace)
    client: Any = redis.Redis.from_url(redis_url)  # redis-py's pubsub() is untyped
    listener = client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(channel)
    with Session(app.engine) as session:
        app.submit(session, "double", 1)
        session.rollback()  # nothing to deliver: no wake-up
        app.submit(session, "double", 2)
        app.submit(session, "double", 3)
        session.commit()  # one wake-up for the transaction
    assert app.runtime.wakeups.flush()  # sent from a thread: before our marker
    client.publish(channel, "end")
    seen: list[bytes] = []

    def read_to_the_end() -> bool:
        message = listener.get_message(timeout=0.1)  # None for the subscribe confirmation too
        if message is not None:
            seen.append(message["data"])
        return bool(seen) and seen[-1] == b"end"

    await wait_until(read_to_the_end, what="the wake-ups, then our end marker")
    assert seen == [b"1", b"end"]
    listener.close()
    client.close()
    await app.aclose()


def refusing_commits(engine: sa.Engine) -> Callable[[Any], None]:
    """A commit the database could not make: the transaction is rolled back, the driver raises."""
    error = engine.dialect.loaded_dbapi.OperationalError

    def refuse(dbapi_connection: Any) -> None:
        dbapi_connection.rollback()
        raise error("the commit failed")

    return refuse


async def test_rows_rolled_back_publish_no_wake_up_and_a_commit_does(
    make_app: Callable[..., App], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = doubling_app(make_app)
    with Session(app.engine) as session:
        task_id = app.submit(session, "double", 1).id
        session.commit()
    assert app.runtime.wakeups.flush()  # its wake-up goes before the listener subscribes
    channel = wake_channel(app.settings.namespace)
    client: Any = redis.Redis.from_url(redis_url)  # redis-py's pubsub() is untyped
    listener = client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(channel)

    async def wake_ups_before_the_marker() -> list[bytes]:
        assert app.runtime.wakeups.flush()  # sent from a thread: before our marker
        client.publish(channel, "end")
        seen: list[bytes] = []

        def read_to_the_end() -> bool:
            message = listener.get_message(timeout=0.1)
            if message is not None:
                seen.append(message["data"])
            return bool(seen) and seen[-1] == b"end"

        await wait_until(read_to_the_end, what="the wake-ups, then our end marker")
        return seen[:-1]

    with Session(app.engine) as session:
        app.submit(session, "double", 2)
        app.rerun(session, task_id)  # the store's own outbox write, on the session's connection
        session.rollback()
        savepoint = session.begin_nested()
        app.submit(session, "double", 3)
        app.rerun(session, task_id)
        savepoint.rollback()
        session.commit()  # commits none of the rows above
    session = Session(app.engine)
    app.submit(session, "double", 4)
    app.rerun(session, task_id)
    session.close()  # uncommitted: rolled back
    session.commit()  # a new, empty transaction of the same session
    with Session(app.engine) as session, monkeypatch.context() as patched:
        app.rerun(session, task_id)
        patched.setattr(app.engine.dialect, "do_commit", refusing_commits(app.engine))
        with pytest.raises(sa.exc.DBAPIError):
            session.commit()
    assert await wake_ups_before_the_marker() == []

    with Session(app.engine) as session:
        savepoint = session.begin_nested()
        app.rerun(session, task_id)
        savepoint.commit()  # released: its rows are the transaction's
        session.commit()
    assert await wake_ups_before_the_marker()
    listener.close()
    client.close()
    await app.aclose()


async def test_a_wake_up_that_cannot_reach_a_cluster_leaves_the_commit_alone(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    # Nothing listens on port 1: redis-py's cluster client fails to start with
    # RedisClusterException, which is no RedisError.
    app = App(database_url, "redis+cluster://127.0.0.1:1", namespace, data_dir=tmp_path, **FAST)
    app.create_all()
    helpers.doubling_app(lambda: app)
    with Session(app.engine) as session:
        handle = app.submit(session, "double", 4)
        session.commit()
    assert app.get_task(handle.id).state is TaskState.PENDING
    await app.aclose()
