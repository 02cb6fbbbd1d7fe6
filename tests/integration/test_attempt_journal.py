"""What a worker's attempt holds while its handler runs: the journal only once the handler asks
for it (``ctx.journal`` or ``current_journal()``, from the handler's own task or a branch of it),
and few objects otherwise: a thousand attempts in flight are a thousand times each object, for
the garbage collector to walk."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from durable_tasks import App, TaskContext, TaskHandle, current_journal, journaled
from durable_tasks.journal import Journal
from durable_tasks.worker import Worker
from tests.helpers import register_fan, submit_all

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

#: GC-tracked objects one async attempt may hold while its handler waits (the handler's own
#: frame, its task and the claim included). A closure, a partial or an unused journal per
#: attempt each add some: a worker running 1,000 attempts collects once more per 5,000 objects.
#: About 21 on a quiet machine, and 20-21 beside three CPU burners once the census waits for
#: the count to stop falling; a census taken the moment the last attempt parked counted 27.4 and
#: 28.1 in make test runs under load (a second Context and another coroutine per attempt still
#: finishing its start). An unused journal per attempt with a closure for the heartbeat counted
#: 34: the bound sits between.
MAX_OBJECTS_PER_ATTEMPT = 28
#: The same with a recording tracer, which an earlier test in the same process may have installed
#: (OpenTelemetry's provider is set once per process): each attempt also holds its span, the
#: context token and manager and a second Context, 25-28.2 in all (make test). The journal and
#: closure above add 13 either way.
MAX_OBJECTS_PER_ATTEMPT_TRACED = 35


def tracing_records() -> bool:
    span = trace.get_tracer(__name__).start_span("probe")
    span.end()
    return isinstance(span, ReadableSpan)  # the SDK's span; the API's no-op one is not


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Journal]:
    """The journals the worker makes."""
    journals: list[Journal] = []

    def counting(*args: Any, **kwargs: Any) -> Journal:
        journal = Journal(*args, **kwargs)
        journals.append(journal)
        return journal

    monkeypatch.setattr(journaled, "Journal", counting)
    return journals


async def test_a_handler_that_never_asks_for_its_journal_gets_none_made(app: App, made: list[Journal]) -> None:
    @app.task(name="plain", queue="jobs")
    async def plain(ctx: TaskContext[int], n: int) -> int:
        return n + 1

    [handle] = submit_all(app, plain, [2])
    assert await result_of(app, handle) == 3
    assert made == []


async def test_the_journal_is_made_once_when_first_asked_for(app: App, made: list[Journal]) -> None:
    seen: list[object] = []

    @app.task(name="asks", queue="jobs")
    async def asks(ctx: TaskContext[int], n: int) -> int:
        seen.extend([ctx.journal, current_journal(), ctx.journal])
        assert ctx.journal is not None
        return int(await ctx.journal.step("double", lambda: 2 * n))

    [handle] = submit_all(app, asks, [21])
    assert await result_of(app, handle) == 42
    assert len(made) == 1
    assert seen == [made[0]] * 3


async def test_a_journal_first_asked_for_in_a_branch_suspends_the_whole_attempt(app: App) -> None:
    fan = register_fan(app, 2)  # each branch asks for the journal first, in a task of gather's
    [handle] = submit_all(app, fan, [5])
    assert await result_of(app, handle) == 10 + 12
    assert [s.kind for s in app.steps(handle.id)] == ["child", "child"]


async def test_an_attempt_in_flight_holds_few_objects(make_app: Callable[..., App]) -> None:
    app = make_app()
    n = 400
    parked = {"count": 0}
    all_parked = asyncio.Event()
    release = asyncio.Event()
    during: Counter[str] = Counter()

    @app.task(name="parks", queue="jobs")
    async def parks(ctx: TaskContext[int], i: int) -> int:
        parked["count"] += 1
        if parked["count"] == n:
            all_parked.set()
        await release.wait()
        return i

    submit_all(app, parks, range(n))
    await app.dispatch_once()
    worker = Worker(app.runtime, concurrency=n)

    async def census_then_release() -> None:
        await all_parked.wait()
        counts = census()
        # On a loaded machine attempts that parked last may still be finishing their start (a
        # frame and a Context more each): census again until the total stops falling.
        for _ in range(50):
            await asyncio.sleep(0.02)
            again = census()
            if sum(again.values()) >= sum(counts.values()):
                break
            counts = again
        during.update(counts)
        release.set()

    watcher = asyncio.ensure_future(census_then_release())
    assert await worker.run(max_tasks=n) == n
    await watcher
    after = census()
    # What the attempts held, by type: what the run left behind (results, caches) only lowers a count.
    held = {kind: (during[kind] - after[kind]) / n for kind in during if during[kind] > after[kind]}
    per_attempt = sum(held.values())
    bound = MAX_OBJECTS_PER_ATTEMPT_TRACED if tracing_records() else MAX_OBJECTS_PER_ATTEMPT
    assert per_attempt <= bound, f"{per_attempt:.1f} objects per attempt: " + ", ".join(
        f"{kind} {count:.2f}" for kind, count in sorted(held.items(), key=lambda kv: -kv[1]) if count >= 0.5
    )
    await app.aclose()


async def result_of(app: App, handle: TaskHandle) -> Any:
    """Run the App's loops until ``handle``'s task settles; its result."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, reaper=False, stop=stop))
        with anyio.fail_after(60):
            result = await handle.wait()
        stop.set()
    return result


def census() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__qualname__ for o in gc.get_objects())
