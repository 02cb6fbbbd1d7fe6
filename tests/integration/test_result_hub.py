"""The result hub against real servers: one subscription wakes many waits; without an
announcement (lost, or Redis away) the waits fall back to batched reads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial

import anyio
import pytest
import redis

from durable_tasks import App, waiting
from durable_tasks.errors import ResultTimeoutError, TaskNotFoundError
from durable_tasks.outcome import TaskOutcome
from durable_tasks.records import TaskState
from durable_tasks.store.outcomes import read_outcomes
from durable_tasks.transport.announce import announce_outcomes
from durable_tasks.transport.keys import outcome_channel
from durable_tasks.waiting import ResultHub, Subscription, await_outcome, wait_outcome
from tests.helpers import doubling_app, reads_tasks, statements_on, submit, submit_all, wait_until

pytestmark = pytest.mark.anyio


def hub_for(app: App, connect: Callable[[], Subscription] | None, *, poll: float = 60.0) -> ResultHub:
    return ResultHub(
        channel=outcome_channel(app.settings.namespace),
        connect=connect,
        read=partial(read_outcomes, app.runtime.store.read_engine, app.settings.namespace),
        poll_initial=poll,
        poll_max=poll,
    )


def subscriber(redis_url: str) -> Callable[[], Subscription]:
    def connect() -> Subscription:
        pubsub: Subscription = redis.Redis.from_url(redis_url, decode_responses=True).pubsub()  # type: ignore[no-untyped-call, unused-ignore]
        return pubsub

    return connect


async def run_all(app: App, n: int) -> None:
    while await app.dispatch_once():
        pass
    assert await app.work(max_tasks=n, timeout=timedelta(seconds=60)) == n


async def test_one_subscription_wakes_every_wait_without_a_second_query(
    make_app: Callable[..., App], redis_url: str
) -> None:
    app = doubling_app(make_app)
    n = 50
    ids = [h.id for h in submit_all(app, "double", range(n))]
    hub = hub_for(app, subscriber(redis_url))
    results: dict[str, str | None] = {}

    async def wait(task_id: str) -> None:
        outcome = await await_outcome(hub, read, task_id, 0, timeout=60)
        results[task_id] = outcome.result_json

    read = partial(read_outcomes, app.runtime.store.read_engine, app.settings.namespace)

    with statements_on(app.engine, reads_tasks) as statements:
        async with anyio.create_task_group() as tg:
            for task_id in ids:
                tg.start_soon(wait, task_id)
            await wait_until(lambda: hub.waiting == n and len(statements) >= n)
            reads_before_work = len(statements)
            await run_all(app, n)
            statements.clear()
            # What a worker does after its commit (wired in the worker itself).
            settled = read_outcomes(app.runtime.store.read_engine, app.settings.namespace, ids)
            await announce_outcomes(
                app.runtime.transport().client, app.settings.namespace, list(settled.values()), inline_bytes=4096
            )
    assert results == {task_id: str(2 * i) for i, task_id in enumerate(ids)}
    assert reads_before_work == n  # one read per wait, when it started
    assert len(statements) == 1  # the test's own read above: the waits read nothing more
    assert hub.polls == 0
    hub.close()
    await app.aclose()


async def test_without_an_announcement_waits_fall_back_to_one_batched_read(make_app: Callable[..., App]) -> None:
    app = doubling_app(make_app)
    ids = [h.id for h in submit_all(app, "double", range(20))]
    # No subscription: the worker's announcements reach no one, as when they are lost or Redis
    # is away (subscribed, a fast announcement would wake the waits before their first poll).
    hub = hub_for(app, None, poll=0.2)
    got: list[TaskState] = []

    async def wait(task_id: str) -> None:
        got.append((await await_outcome(hub, read, task_id, 0, 60)).state)

    read = partial(read_outcomes, app.runtime.store.read_engine, app.settings.namespace)

    async with anyio.create_task_group() as tg:
        for task_id in ids:
            tg.start_soon(wait, task_id)
        await wait_until(lambda: hub.waiting == len(ids))
        await run_all(app, len(ids))  # settled; no announcement heard
    assert got == [TaskState.SUCCEEDED] * len(ids)
    # Batched: the 20 waits share reads (a read per wait would make at least 20 in the first
    # interval alone); how many intervals the run lasts is the machine's load, not asserted.
    assert 1 <= hub.polls < len(ids), hub.polls
    hub.close()
    await app.aclose()


async def test_waits_work_by_polling_when_redis_is_unreachable(make_app: Callable[..., App]) -> None:
    app = doubling_app(make_app)
    task_id = submit(app, "double", 0)
    hub = hub_for(app, subscriber("redis://127.0.0.1:1/0?socket_connect_timeout=0.2"), poll=0.1)
    read = partial(read_outcomes, app.runtime.store.read_engine, app.settings.namespace)
    done = threading.Event()
    outcome: list[object] = []

    def block() -> None:
        outcome.append(wait_outcome(hub, read, task_id, 0, timeout=60))
        done.set()

    thread = threading.Thread(target=block)
    thread.start()
    await wait_until(lambda: hub.waiting == 1)
    await run_all(app, 1)
    await wait_until(done.is_set)
    thread.join()
    assert not hub.subscribed
    assert [getattr(o, "result_json", None) for o in outcome] == ["0"]
    hub.close()
    await app.aclose()


async def test_a_wait_times_out_with_the_last_state_seen_and_an_unknown_id_is_not_found(
    make_app: Callable[..., App], redis_url: str
) -> None:
    app = doubling_app(make_app)
    task_id = submit(app, "double", 0)
    hub = hub_for(app, subscriber(redis_url))
    read = partial(read_outcomes, app.runtime.store.read_engine, app.settings.namespace)
    with pytest.raises(ResultTimeoutError) as caught:
        await await_outcome(hub, read, task_id, 0, timeout=0.3)
    assert caught.value.state == TaskState.PENDING
    assert isinstance(caught.value, TimeoutError)
    with pytest.raises(TaskNotFoundError):
        wait_outcome(hub, read, "no-such-task", 0, timeout=1)
    assert hub.waiting == 0
    hub.close()
    await app.aclose()


async def test_closing_the_app_wakes_its_hub_thread_blocked_on_the_subscription(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub's thread blocks reading its subscription for up to a tick; a close publishes a
    message of no outcome, which the thread reads at once and then ends, rather than when its
    read times out (here the tick is an hour)."""
    monkeypatch.setattr(waiting, "_TICK_S", 3600.0)
    app = doubling_app(make_app)
    handle = app.handle(submit(app, "double", 4))
    await run_all(app, 1)
    assert await handle.wait(timeout=30) == 8  # the hub's thread runs and subscribes
    hub = app.results.hub()
    assert hub.subscribed
    await wait_until(lambda: hub.waiting == 0)
    heard: list[int] = []
    hand_out = hub._hand_out

    def counted(outcomes: Sequence[TaskOutcome]) -> None:
        heard.append(len(outcomes))
        hand_out(outcomes)

    monkeypatch.setattr(hub, "_hand_out", counted)
    await app.aclose()
    assert heard == [0]  # the close's message, read by the blocked thread
    assert not [t for t in threading.enumerate() if t.name == f"dt-results:{hub.channel}" and t.is_alive()]
