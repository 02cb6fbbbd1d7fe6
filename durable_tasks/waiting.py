"""Waiting for a task's outcome: one Redis subscription per App and process, shared by all waits.

A :class:`ResultHub` runs one daemon thread that holds ONE subscription to the namespace's
outcome channel (see :mod:`durable_tasks.outcome`) and hands each announced outcome to the
waits on that task id, whichever thread or event loop they wait on: a thousand waits cost one
subscription and no query while they wait.

A wait is registered first and then reads the task once (so an outcome announced in between
is not missed): a task already settled costs that one read, and a task settled later is
announced with its result, which costs none. Messages are not durable (a worker can die
between its commit and its announcement; a subscriber can be disconnected; a cancel is not
announced), so the hub also reads, as a fallback, the tasks whose waits have heard nothing
for a while, all of them in one query, each wait backing off (``result_poll_initial``
doubling up to ``result_poll_max``). Without Redis, waits work by that polling alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
from redis.exceptions import RedisClusterException, RedisError

from .errors import ResultTimeoutError, TaskNotFoundError
from .outcome import TaskOutcome, decode_outcomes

__all__ = ["ResultHub", "Subscription", "await_outcome", "wait_outcome"]

logger = logging.getLogger(__name__)

#: How long the hub thread blocks on the subscription at most (it also checks for polls and stop).
_TICK_S = 0.5
#: Reconnect backoff after the subscription failed: from this, doubling, up to _RECONNECT_MAX_S.
_RECONNECT_S = 0.5
_RECONNECT_MAX_S = 10.0
#: The thread ends (closing its connection) after this long without a wait.
_IDLE_S = 60.0

Reader = Callable[[Sequence[str]], Mapping[str, TaskOutcome]]


class Subscription(Protocol):
    """The part of redis-py's ``PubSub`` (and ``ClusterPubSub``) the hub uses."""

    def subscribe(self, *channels: str) -> Any: ...

    def get_message(self, ignore_subscribe_messages: bool = ..., timeout: float = ...) -> Any: ...

    def close(self) -> None: ...


class _Waiter:
    """One wait: accepts the first final outcome of ``min_generation`` or a newer generation."""

    __slots__ = ("deliver", "done", "interval", "last_seen", "min_generation", "next_poll", "task_id")

    def __init__(self, task_id: str, min_generation: int, deliver: Callable[[TaskOutcome], None]) -> None:
        self.task_id = task_id
        self.min_generation = min_generation
        self.deliver = deliver
        self.done = False
        self.last_seen: TaskOutcome | None = None
        self.next_poll = 0.0
        self.interval = 0.0


class ResultHub:
    """The waits of one App in this process and the one subscription that wakes them."""

    def __init__(
        self,
        *,
        channel: str,
        connect: Callable[[], Subscription] | None,
        read: Reader,
        poll_initial: float,
        poll_max: float,
        connect_wait: float = 2.0,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.channel = channel
        self._connect = connect
        #: Publishes a message of no outcome on ``channel``: the thread's read of its
        #: subscription returns, so :meth:`close` does not wait out a tick.
        self._wake_subscription = wake
        self._read = read
        self._poll_initial = poll_initial
        self._poll_max = poll_max
        self._connect_wait = connect_wait
        self._lock = threading.Lock()
        self._waiters: dict[str, set[_Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._attempted = threading.Event()  # the thread's first subscription attempt has ended
        if connect is None:
            self._attempted.set()
        self._subscribed = False
        # Waits that read their task while no subscription was live may have missed its
        # announcement: once a subscription is back, every wait is read once.
        self._gap = False
        self._recheck = False
        self.polls = 0  # fallback reads issued (statements), for tests and metrics

    # -- waits ---------------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        """Whether the subscription is live (otherwise waits rely on polling)."""
        return self._subscribed

    @property
    def waiting(self) -> int:
        """How many waits are registered."""
        with self._lock:
            return sum(len(ws) for ws in self._waiters.values())

    def add(self, task_id: str, min_generation: int, deliver: Callable[[TaskOutcome], None]) -> _Waiter:
        """Register a wait (its fallback read is due after ``poll_initial``)."""
        waiter = _Waiter(task_id, min_generation, deliver)
        waiter.interval = self._poll_initial
        waiter.next_poll = time.monotonic() + self._poll_initial
        with self._lock:
            self._waiters.setdefault(task_id, set()).add(waiter)
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                if self._connect is not None:
                    self._attempted.clear()
                self._thread = threading.Thread(target=self._run, name=f"dt-results:{self.channel}", daemon=True)
                self._thread.start()
        return waiter

    def discard(self, waiter: _Waiter) -> None:
        """Unregister a wait (it ended, timed out or was cancelled)."""
        with self._lock:
            waiter.done = True
            found = self._waiters.get(waiter.task_id)
            if found is not None:
                found.discard(waiter)
                if not found:
                    del self._waiters[waiter.task_id]

    def offer(self, waiter: _Waiter, outcome: TaskOutcome) -> bool:
        """Give one wait what was read or heard; True once it has its final outcome."""
        with self._lock:
            return self._offer(waiter, outcome)

    def wait_ready(self) -> None:
        """Block until the first subscription attempt has ended (bounded): after that, an
        outcome committed later is announced to this process."""
        self._attempted.wait(self._connect_wait)

    @property
    def ready(self) -> bool:
        """Whether :meth:`wait_ready` would return at once."""
        return self._attempted.is_set()

    def close(self) -> None:
        """Stop the thread and close the subscription (waits still registered keep waiting).
        A thread blocked reading its subscription is woken by a message of no outcome, if the
        hub was given a way to publish one; else it stops within a tick (``_TICK_S``)."""
        with self._lock:
            self._stopping = True
            thread, subscribed = self._thread, self._subscribed
        self._wake.set()
        if thread is None or thread is threading.current_thread():
            return
        if subscribed and self._wake_subscription is not None:
            try:
                self._wake_subscription()
            except (RedisError, RedisClusterException, OSError) as exc:  # the tick ends the wait
                logger.debug("waking the result hub's subscription failed: %s", exc)
        thread.join(timeout=5)

    # -- the thread ----------------------------------------------------------------------

    def _offer(self, waiter: _Waiter, outcome: TaskOutcome) -> bool:
        if waiter.done:
            return True
        if outcome.generation < waiter.min_generation:
            return False  # an older generation's news (a rerun superseded it)
        waiter.last_seen = outcome
        if not outcome.final:
            return False
        waiter.done = True
        waiter.deliver(outcome)
        return True

    def _run(self) -> None:
        subscription: Subscription | None = None
        reconnect_at, backoff = 0.0, _RECONNECT_S
        idle_since = time.monotonic()
        try:
            while True:
                with self._lock:
                    if self._waiters:
                        idle_since = time.monotonic()
                    elif self._stopping or time.monotonic() - idle_since > _IDLE_S:
                        self._thread = None  # add() starts a new thread from here on
                        return
                    if self._stopping:
                        return
                if subscription is None and self._connect is not None and time.monotonic() >= reconnect_at:
                    subscription = self._subscribe()
                    if subscription is None:
                        reconnect_at, backoff = time.monotonic() + backoff, min(backoff * 2, _RECONNECT_MAX_S)
                    else:
                        backoff = _RECONNECT_S
                subscription = self._listen(subscription)
                self._poll_due()
        finally:
            self._subscribed = False
            self._attempted.set()
            if subscription is not None:
                _close_quietly(subscription)

    def _subscribe(self) -> Subscription | None:
        assert self._connect is not None
        subscription: Subscription | None = None
        try:
            subscription = self._connect()
            subscription.subscribe(self.channel)
            deadline = time.monotonic() + self._connect_wait
            while time.monotonic() < deadline:  # the confirmation: from here on, nothing is missed
                message = subscription.get_message(timeout=deadline - time.monotonic())
                if message is not None and message.get("type") == "subscribe":
                    self._subscribed, self._recheck, self._gap = True, self._gap, False
                    return subscription
            raise TimeoutError("no subscription confirmation")
        except (RedisError, RedisClusterException, OSError) as exc:  # a cluster that finds no node
            logger.warning("cannot subscribe to result announcements (%s); result waits poll", type(exc).__name__)
            self._gap = True
            if subscription is not None:
                _close_quietly(subscription)
            return None
        finally:
            self._attempted.set()

    def _listen(self, subscription: Subscription | None) -> Subscription | None:
        """Wait for one message (or a short while) and hand it out; None when the subscription broke."""
        timeout = min(_TICK_S, max(0.0, self._next_poll() - time.monotonic()))
        if subscription is None:
            self._wake.wait(timeout)
            self._wake.clear()
            return None
        try:
            message = subscription.get_message(ignore_subscribe_messages=True, timeout=timeout)
        except (RedisError, OSError) as exc:
            logger.warning("result announcements lost (%s); resubscribing, waits poll meanwhile", type(exc).__name__)
            self._subscribed, self._gap = False, True
            _close_quietly(subscription)
            return None
        if message is not None and message.get("type") == "message":
            self._hand_out(decode_outcomes(message["data"]))
        return subscription

    def _hand_out(self, outcomes: Sequence[TaskOutcome]) -> None:
        with self._lock:
            for outcome in outcomes:
                for waiter in list(self._waiters.get(outcome.task_id, ())):
                    self._offer(waiter, outcome)

    def _next_poll(self) -> float:
        with self._lock:
            if self._recheck:
                return 0.0
            return min((w.next_poll for ws in self._waiters.values() for w in ws), default=time.monotonic() + _TICK_S)

    def _poll_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            everyone, self._recheck = self._recheck, False
            due = [w for ws in self._waiters.values() for w in ws if everyone or w.next_poll <= now]
            for w in due:
                w.interval = min(w.interval * 2, self._poll_max) if not everyone else w.interval
                w.next_poll = now + w.interval
        if not due:
            return
        ids = sorted({w.task_id for w in due})
        try:
            self.polls += 1
            found = self._read(ids)
        except Exception as exc:  # the database is away: the next poll tries again
            logger.warning("reading %d awaited tasks failed (%s); retrying", len(ids), type(exc).__name__)
            return
        with self._lock:
            for w in due:
                outcome = found.get(w.task_id)
                if outcome is not None:
                    self._offer(w, outcome)


def _close_quietly(subscription: Subscription) -> None:
    with contextlib.suppress(RedisError, OSError):
        subscription.close()


def _read_one(read: Reader, task_id: str) -> TaskOutcome:
    found = read([task_id]).get(task_id)
    if found is None:
        raise TaskNotFoundError(f"no task {task_id!r} in this namespace")
    return found


def wait_outcome(hub: ResultHub, read: Reader, task_id: str, generation: int, timeout: float | None) -> TaskOutcome:
    """Block until the task has a final outcome of ``generation`` or newer (complete: with its
    result or error); raise :class:`ResultTimeoutError` when ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    arrived = threading.Event()
    box: list[TaskOutcome] = []

    def deliver(outcome: TaskOutcome) -> None:
        box.append(outcome)
        arrived.set()

    waiter = hub.add(task_id, generation, deliver)
    try:
        hub.wait_ready()
        hub.offer(waiter, _read_one(read, task_id))
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not arrived.wait(remaining):
                raise _timeout(task_id, waiter, timeout)
            if box[-1].complete:
                return box[-1]
            arrived.clear()
            waiter.done = False  # announced without its result: read it (a rerun may follow it)
            hub.offer(waiter, _read_one(read, task_id))
    finally:
        hub.discard(waiter)


async def await_outcome(
    hub: ResultHub, read: Reader, task_id: str, generation: int, timeout: float | None
) -> TaskOutcome:
    """:func:`wait_outcome` for an event loop (asyncio): the wait itself holds no thread."""
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue[TaskOutcome] = asyncio.Queue()

    def deliver(outcome: TaskOutcome) -> None:
        loop.call_soon_threadsafe(arrived.put_nowait, outcome)

    waiter = hub.add(task_id, generation, deliver)
    try:
        with anyio.fail_after(timeout):
            if not hub.ready:
                await anyio.to_thread.run_sync(hub.wait_ready)
            hub.offer(waiter, await anyio.to_thread.run_sync(_read_one, read, task_id))
            while not (outcome := await arrived.get()).complete:
                waiter.done = False
                hub.offer(waiter, await anyio.to_thread.run_sync(_read_one, read, task_id))
            return outcome
    except TimeoutError:
        raise _timeout(task_id, waiter, timeout) from None
    finally:
        hub.discard(waiter)


def _timeout(task_id: str, waiter: _Waiter, timeout: float | None) -> ResultTimeoutError:
    seen = waiter.last_seen
    state = None if seen is None else seen.state
    return ResultTimeoutError(
        f"task {task_id} has no outcome after {timeout}s (last seen: {state or 'unknown'}); "
        "wait again, or look at it with `durable-tasks tasks show`",
        task_id=task_id,
        state=state,
    )
