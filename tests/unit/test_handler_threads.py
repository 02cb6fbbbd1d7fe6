"""HandlerThreads: the worker's own threads for sync handlers (durable_tasks.handler_threads)."""

from __future__ import annotations

import sys
import threading
import time
from contextvars import ContextVar

import anyio
import pytest

from durable_tasks.handler_threads import HandlerThreads

pytestmark = pytest.mark.anyio

_who: ContextVar[str] = ContextVar("who", default="nobody")
WAIT_S = 10.0  # bound on waiting for a condition; never reached when the code is right


def wait_for(event: threading.Event) -> None:
    assert event.wait(WAIT_S), "the event was never set"


async def test_results_exceptions_and_the_callers_context_cross_over() -> None:
    threads = HandlerThreads(4)
    _who.set("the caller")
    try:
        assert await threads.run_sync(lambda a, b: a + b, 2, 3) == 5
        assert await threads.run_sync(_who.get) == "the caller"
        assert await threads.run_sync(threading.current_thread) is not threading.current_thread()
        with pytest.raises(ZeroDivisionError):
            await threads.run_sync(lambda: 1 / 0)
    finally:
        threads.close()


async def test_a_burst_of_calls_wakes_one_thread_which_takes_them_all() -> None:
    threads = HandlerThreads(16, stall=WAIT_S)  # no stall check comes while the burst runs
    names: list[str] = []

    def record(i: int) -> int:
        names.append(threading.current_thread().name)
        return i

    async def call(i: int) -> None:
        assert await threads.run_sync(record, i) == i

    try:
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(call, i)
        assert len(names) == 200
        assert threads.threads == 1
        assert set(names) == {names[0]}
    finally:
        threads.close()


async def test_blocking_calls_get_threads_up_to_the_limit_and_no_more() -> None:
    threads = HandlerThreads(3)
    running, peak, lock = 0, 0, threading.Lock()
    all_in, release = threading.Event(), threading.Event()

    def block() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            if running == 3:
                all_in.set()
        wait_for(release)
        with lock:
            running -= 1

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(threads.run_sync, block)
            await anyio.to_thread.run_sync(wait_for, all_in)  # three run at once: none waits for another
            release.set()
        assert peak == 3
    finally:
        threads.close()


async def test_a_cancelled_wait_returns_at_once_and_its_thread_stops_counting() -> None:
    threads = HandlerThreads(1)
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def stuck() -> str:
        started.set()
        wait_for(release)
        finished.set()
        return "late"

    try:
        with anyio.move_on_after(WAIT_S) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(threads.run_sync, stuck)
                await anyio.to_thread.run_sync(wait_for, started)
                tg.cancel_scope.cancel()  # as a task's timeout does
        assert not scope.cancelled_caught
        assert not finished.is_set()  # abandoned, still running in its thread
        # The limit is 1 and that thread is busy: another call still runs, on a new thread.
        assert await threads.run_sync(lambda: "next") == "next"
        release.set()
        await anyio.to_thread.run_sync(wait_for, finished)
    finally:
        release.set()
        threads.close()


async def test_a_call_cancelled_before_it_started_never_runs() -> None:
    threads = HandlerThreads(1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def first() -> None:
        started.set()
        wait_for(release)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(threads.run_sync, first)
            await anyio.to_thread.run_sync(wait_for, started)
            with anyio.move_on_after(0):
                await threads.run_sync(ran.append, "second")
            release.set()
        assert await threads.run_sync(lambda: "after") == "after"  # queued behind a live thread
        assert ran == []
    finally:
        release.set()
        threads.close()


async def wait_for_no_threads(threads: HandlerThreads) -> None:
    deadline = time.monotonic() + WAIT_S
    while threads.threads and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    assert threads.threads == 0


async def test_close_ends_idle_threads_and_a_later_call_starts_them_again() -> None:
    threads = HandlerThreads(2)
    assert await threads.run_sync(lambda: 1) == 1
    threads.close()
    await wait_for_no_threads(threads)
    assert await threads.run_sync(lambda: 2) == 2
    threads.close()


def test_idle_threads_end_by_themselves_and_a_new_loop_gets_threads_and_stall_checks() -> None:
    threads = HandlerThreads(4, idle_exit=0.05)
    both_in = threading.Barrier(2, timeout=WAIT_S)

    async def two_that_meet() -> None:  # only a stall check starts the second thread
        async with anyio.create_task_group() as tg:
            tg.start_soon(threads.run_sync, both_in.wait)
            tg.start_soon(threads.run_sync, both_in.wait)
        await wait_for_no_threads(threads)  # nothing closes it: the threads end on their own

    anyio.run(two_that_meet)
    anyio.run(two_that_meet)  # a fresh loop: its own stall checks, new threads


async def test_a_thread_without_a_start_for_less_than_two_switch_intervals_gets_no_siblings() -> None:
    """A thread the busy loop keeps from the GIL gets it within one switch interval: until two
    have passed without an item starting, it is taken as waiting, not blocked. (The stall check
    runs every millisecond; with a 1 s switch interval a handler that holds its thread for
    0.3 s gets no sibling, where one blocked for two intervals does, as the test above shows.)"""
    threads = HandlerThreads(8, stall=0.001)
    started, release = threading.Event(), threading.Event()
    names: list[str] = []

    def first() -> None:
        names.append(threading.current_thread().name)
        started.set()
        wait_for(release)

    def record() -> None:
        names.append(threading.current_thread().name)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(threads.run_sync, first)
            await anyio.to_thread.run_sync(wait_for, started)
            for _ in range(20):
                tg.start_soon(threads.run_sync, record)
            await anyio.sleep(0.3)  # 300 stall checks, each seeing items wait and none start
            assert threads.threads == 1
            release.set()
        assert len(names) == 21
        assert set(names) == {names[0]}
    finally:
        sys.setswitchinterval(interval)
        threads.close()
