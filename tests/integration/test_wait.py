"""Waiting for results end to end: the worker's commit announces, the waits wake without a
second query; failures, cancels, reruns and a crashed worker as the waiter sees them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial

import anyio
import pytest
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskHandle
from durable_tasks.errors import TaskCancelledError, TaskFailedError, TaskNotFoundError
from tests import helpers
from tests.helpers import claim_entry, reads_tasks, statements_on, submit_all, wait_until

pytestmark = pytest.mark.anyio

QUIET = {"result_poll_initial": timedelta(minutes=5), "result_poll_max": timedelta(minutes=5)}


def doubling_app(make_app: Callable[..., App], **overrides: object) -> App:
    """``tests.helpers.doubling_app`` and a task ``fail`` (one attempt) that raises."""
    app = helpers.doubling_app(make_app, **overrides)

    @app.task(name="fail", queue="jobs", max_attempts=1)
    def fail(ctx: TaskContext[int], n: int) -> int:
        raise ValueError(f"no {n}")

    return app


@asynccontextmanager
async def running(app: App) -> AsyncIterator[None]:
    """Dispatcher, worker and reaper of ``app`` (another process's, as far as the waits know)."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, stop=stop))
        yield
        stop.set()


async def test_a_thousand_async_waits_cost_one_query_each(make_app: Callable[..., App]) -> None:
    client, runtime = doubling_app(make_app, **QUIET), doubling_app(make_app)
    n = 1000
    handles = submit_all(client, "double", range(n))
    results: dict[str, int] = {}

    async def wait(handle: TaskHandle) -> None:
        results[handle.id] = await handle.wait(timeout=120)

    with statements_on(client.engine, reads_tasks) as reads:
        async with anyio.create_task_group() as tg:
            for handle in handles:
                tg.start_soon(wait, handle)
            await wait_until(lambda: client.results.hub().waiting == n and len(reads) == n, timeout=60)
            async with running(runtime):
                await wait_until(lambda: len(results) == n, timeout=180)
    assert results == {h.id: 2 * i for i, h in enumerate(handles)}
    assert len(reads) == n  # the read each wait made when it started, and nothing after
    assert client.results.hub().polls == 0
    await client.aclose()
    await runtime.aclose()


async def test_a_thousand_sync_results_cost_one_query_each(make_app: Callable[..., App]) -> None:
    client, runtime = doubling_app(make_app, **QUIET), doubling_app(make_app)
    n = 1000
    handles = submit_all(client, "double", range(n))
    with statements_on(client.engine, reads_tasks) as reads, ThreadPoolExecutor(max_workers=100) as pool:
        futures = [pool.submit(h.result, 120) for h in handles]
        await wait_until(lambda: client.results.hub().waiting >= 100, timeout=60)
        async with running(runtime):
            await wait_until(lambda: all(f.done() for f in futures), timeout=180)
    assert [f.result() for f in futures] == [2 * i for i in range(n)]
    assert len(reads) <= n  # at most one per wait: the later ones found their task done
    assert client.results.hub().polls == 0
    await client.aclose()
    await runtime.aclose()


async def test_a_failed_task_raises_with_its_state_and_error(make_app: Callable[..., App]) -> None:
    client, runtime = doubling_app(make_app, **QUIET), doubling_app(make_app)
    [handle] = submit_all(client, "fail", [7])
    async with running(runtime):
        with pytest.raises(TaskFailedError) as caught:
            await handle.wait(timeout=60)
    assert (caught.value.state, caught.value.error_type) == ("FAILED", "ValueError")
    assert "no 7" in (caught.value.error_message or "")
    await client.aclose()
    await runtime.aclose()


async def test_a_cancel_is_seen_by_the_fallback_read(make_app: Callable[..., App]) -> None:
    app = doubling_app(make_app, result_poll_initial=timedelta(milliseconds=100))
    [handle] = submit_all(app, "double", [0])
    async with anyio.create_task_group() as tg:

        async def expect_cancelled() -> None:
            with pytest.raises(TaskCancelledError):
                await handle.wait(timeout=60)

        tg.start_soon(expect_cancelled)
        await wait_until(lambda: app.results.hub().waiting == 1)
        with Session(app.engine) as session:
            assert app.cancel(session, handle.id)
            session.commit()
    await app.aclose()


async def test_a_wait_follows_a_rerun_to_the_new_generation(make_app: Callable[..., App]) -> None:
    client, runtime = doubling_app(make_app, **QUIET), doubling_app(make_app)
    [handle] = submit_all(client, "double", [21])
    with Session(client.engine) as session:
        assert client.rerun(session, handle.id) == 1  # before generation 0 ever ran
        session.commit()
    async with running(runtime):
        assert await handle.wait(timeout=60) == 42
    assert client.get_task(handle.id).generation == 1
    await client.aclose()
    await runtime.aclose()


async def test_a_wait_outlives_a_crashed_worker(make_app: Callable[..., App]) -> None:
    client, runtime = doubling_app(make_app, **QUIET), doubling_app(make_app)
    [handle] = submit_all(client, "double", [5])
    await runtime.dispatch_once()
    [entry] = await runtime.runtime.transport().read(["jobs"], "doomed", count=1, block=timedelta(seconds=1))
    assert await claim_entry(runtime, entry, "doomed") is not None  # claimed, then its worker "died"
    async with running(runtime):  # the reaper redelivers once the lease lapses; a worker runs it
        assert await handle.wait(timeout=60) == 10
    await client.aclose()
    await runtime.aclose()


async def test_app_handle_waits_for_a_task_submitted_elsewhere(make_app: Callable[..., App]) -> None:
    submitter, runtime = doubling_app(make_app), doubling_app(make_app)
    elsewhere = doubling_app(make_app, **QUIET)
    [handle] = submit_all(submitter, "double", [4])
    found = elsewhere.handle(handle.id)
    assert (found.id, found.name, found.generation) == (handle.id, "double", 0)
    async with running(runtime):
        assert await found.wait(timeout=60) == 8
    assert found.result(timeout=5) == 8  # settled: one read
    with pytest.raises(TaskNotFoundError):
        elsewhere.handle("no-such-task")
    for a in (submitter, runtime, elsewhere):
        await a.aclose()
