"""Journal.run runs the handler in the caller's task: its suspension cancels that task and takes
the cancellation back, while a cancellation or a timeout from outside still ends the attempt."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_tasks import App, TaskContext
from durable_tasks.journal import Journal, Suspended, current_journal
from tests.journal_fake import FakeStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'x.sqlite3'}", "redis://127.0.0.1:1", "unit")


@pytest.fixture
def store(app: App) -> FakeStore:
    @app.task(name="leaf")
    async def leaf(ctx: TaskContext[None], _: None) -> str:
        return "leaf"

    return FakeStore(app)


def new_journal(store: FakeStore) -> Journal:
    return Journal(store.backend("run-1", 0), "run-1", 0, first_attempt=True)


def this_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    assert task is not None
    return task


async def test_a_suspension_leaves_the_calling_task_uncancelled_and_usable(store: FakeStore) -> None:
    journal = new_journal(store)

    async def handler() -> str:
        assert current_journal() is journal
        return str(await journal.child("leaf", None))

    assert await journal.run(handler) == (None, Suspended.WAITING)
    assert this_task().cancelling() == 0
    assert current_journal() is None
    with anyio.fail_after(5):  # a later await in the same task is not cancelled
        await asyncio.sleep(0.01)


async def test_a_handler_that_swallows_the_suspension_still_suspends_and_leaves_no_cancellation(
    store: FakeStore,
) -> None:
    journal = new_journal(store)

    async def handler() -> str:
        try:
            return str(await journal.child("leaf", None))
        except asyncio.CancelledError:
            return "swallowed"

    assert await journal.run(handler) == (None, Suspended.WAITING)
    assert this_task().cancelling() == 0


async def test_a_handler_returning_before_any_wait_runs_in_the_calling_task_and_returns_its_result(
    store: FakeStore,
) -> None:
    journal = new_journal(store)
    caller = this_task()
    tasks_before = len(asyncio.all_tasks())

    async def handler() -> int:
        assert this_task() is caller  # no task per attempt (it costs more than a no-op handler)
        assert len(asyncio.all_tasks()) == tasks_before  # nor a watcher before the first wait
        return 42

    assert await journal.run(handler) == (42, None)
    assert store.suspensions == 0


async def test_a_cancellation_from_outside_while_blocked_propagates_instead_of_suspending(store: FakeStore) -> None:
    journal = new_journal(store)
    blocked = asyncio.Event()

    async def handler() -> str:
        blocked.set()
        return str(await journal.child("leaf", None))

    attempt = asyncio.ensure_future(journal.run(handler))
    await blocked.wait()
    attempt.cancel()  # before the watcher's quiet turns are over
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert store.suspensions == 0


async def test_a_cancellation_from_outside_at_the_suspension_propagates(store: FakeStore) -> None:
    journal = new_journal(store)

    async def handler() -> str:
        try:
            return str(await journal.child("leaf", None))
        except asyncio.CancelledError:
            this_task().cancel()  # a stopping worker cancels the attempt at the same moment
            raise

    attempt = asyncio.ensure_future(journal.run(handler))
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert attempt.cancelled()
    assert store.suspensions == 0


async def test_a_timeout_ends_a_blocked_handler_with_timeout_error(store: FakeStore) -> None:
    journal = new_journal(store)

    async def handler() -> str:
        return str(await journal.child("leaf", None))

    with pytest.raises(TimeoutError), anyio.fail_after(0.001):  # well before the watcher's settle time
        await journal.run(handler)
    assert store.suspensions == 0
    assert this_task().cancelling() == 0


async def test_a_timeout_ends_a_long_step_with_timeout_error(store: FakeStore) -> None:
    journal = new_journal(store)

    async def handler() -> None:
        await journal.step("long", lambda: asyncio.sleep(30))

    with pytest.raises(TimeoutError), anyio.fail_after(0.05):
        await journal.run(handler)
    assert this_task().cancelling() == 0
