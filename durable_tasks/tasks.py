"""Declaring tasks: the ``@app.task`` decorator, the context a handler receives, handles."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, Unpack, cast, get_type_hints, overload

import anyio
import sqlalchemy as sa
from pydantic import TypeAdapter
from sqlmodel import Session

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
from .errors import ConfigurationError
from .flow.policy import NO_FLOW, TaskFlow
from .handler_threads import HandlerThreads
from .journal import Journal

__all__ = [
    "OnCommitHook",
    "OnFailureHook",
    "ResultWaiter",
    "Submit",
    "SubmitMany",
    "SubmitManyOptions",
    "SubmitOptions",
    "Task",
    "TaskContext",
    "TaskDecorator",
    "TaskHandle",
    "current_task",
    "session_hooks",
]

PayloadT = TypeVar("PayloadT")
ResultT = TypeVar("ResultT")
P = TypeVar("P")
R = TypeVar("R")

#: ``hook(session, ctx, result)``: runs inside the fenced result transaction; never commits.
OnCommitHook = Callable[[Session, "TaskContext[PayloadT]", ResultT], None]

#: ``hook(session, ctx, error)``: runs inside the fenced transaction that records a FINAL failure.
OnFailureHook = Callable[[Session, "TaskContext[PayloadT]", BaseException], None]


#: Guards the first making of a TaskContext's ``cancelled`` event (see there).
_MAKE_CANCELLED = threading.Lock()


@dataclass(slots=True)
class TaskContext(Generic[PayloadT]):
    """What a handler knows about the execution it runs in."""

    task_id: str
    name: str
    queue: str
    generation: int
    attempt: int
    delivery: int
    idempotency_key: str | None
    payload: PayloadT
    shadow: bool = False
    _link: AttemptLink | None = field(default=None, repr=False)
    fenced_out: bool = False
    _cancelled: threading.Event | None = field(default=None, repr=False)

    @property
    def journal(self) -> Journal | None:
        """The step journal of this attempt (async handlers run by a worker; see
        :mod:`durable_tasks.journal`), made on first use: most handlers never use it."""
        return self._link.journal() if self._link is not None else None

    @property
    def cancelled(self) -> threading.Event:
        """Set when this attempt's result can no longer land (fenced out) or its timeout
        passed: a sync handler, which cannot be cancelled, should check it and stop early."""
        # Made on first use: most attempts never look, and an Event (a Condition and two locks)
        # per attempt is a visible share of a short sync task's cost. The handler's thread and
        # the loop (a timeout, a fence) may both look first: the lock makes them share one.
        event = self._cancelled
        if event is None:
            with _MAKE_CANCELLED:
                event = self._cancelled
                if event is None:
                    event = self._cancelled = threading.Event()
        return event

    @property
    def idempotency_token(self) -> str:
        """``"task_id:generation"``: pass it to downstream systems so a re-run body is harmless."""
        return f"{self.task_id}:{self.generation}"

    async def heartbeat(self) -> bool:
        """Extend the lease now (the worker also does so on its own); False once fenced out."""
        if self._link is None:
            return True
        alive = await self._link.heartbeat()
        if not alive:
            self.fenced_out = True
            self.cancelled.set()
        return alive


class AttemptLink(Protocol):
    """What ties a :class:`TaskContext` to the worker running its attempt (one object per
    attempt: :class:`~durable_tasks.journaled.StoreJournal`)."""

    async def heartbeat(self) -> bool:
        """Extend the attempt's lease now; False once it is fenced out."""
        ...

    def journal(self) -> Journal | None:
        """The attempt's journal (made on the first call), or None for a sync handler."""
        ...


@dataclass(frozen=True, slots=True)
class TaskHandle:
    """What ``submit`` returns: the durable task's id and generation; wait on it for the result."""

    id: str
    name: str
    generation: int
    created: bool
    _waits: ResultWaiter | None = field(default=None, repr=False, compare=False)

    def result(self, timeout: timedelta | float | None = None) -> Any:
        """Block until the task settles and return its result (``timeout``: seconds or a
        timedelta; None waits as long as it takes).

        Returns the first final outcome of this generation or a newer one (a rerun). Raises
        :class:`~durable_tasks.errors.TaskFailedError` (FAILED, DEAD),
        :class:`~durable_tasks.errors.TaskCancelledError`, or
        :class:`~durable_tasks.errors.ResultTimeoutError` when ``timeout`` passes first.
        Call it from sync code: on an event loop use :meth:`wait`.
        """
        return self._require_waits().result(self, timeout)

    async def wait(self, timeout: timedelta | float | None = None) -> Any:
        """:meth:`result` for async code: the wait holds no thread and no connection."""
        return await self._require_waits().wait(self, timeout)

    def _require_waits(self) -> ResultWaiter:
        if self._waits is None:
            raise TypeError("this handle was built by hand; get one from submit() or app.handle(task_id)")
        return self._waits


class ResultWaiter(Protocol):
    """Where a handle waits for its task's outcome: the App's
    :class:`~durable_tasks.result_waits.ResultWaits`."""

    def result(self, handle: TaskHandle, timeout: timedelta | float | None) -> Any:
        """Block until the handle's task settles."""
        ...

    async def wait(self, handle: TaskHandle, timeout: timedelta | float | None) -> Any:
        """Wait on the event loop until the handle's task settles."""
        ...


class SubmitManyOptions(TypedDict, total=False):
    """The keyword arguments of ``submit_many`` (``App.submit`` documents each), all optional:
    ``shadow``, ``partition_key``, ``delay`` or ``not_before``, ``priority`` and
    ``concurrency_key``. They apply to every intent of the call."""

    shadow: bool
    partition_key: str | None
    delay: timedelta | None
    not_before: datetime | None
    priority: int | None
    concurrency_key: str | None


class SubmitOptions(SubmitManyOptions, total=False):
    """The keyword arguments of ``submit`` and ``asubmit`` (``App.submit`` documents each):
    :class:`SubmitManyOptions` and the intent's ``idempotency_key``."""

    idempotency_key: str | None


class Submit(Protocol):
    """How a task records an intent: the App's ``submit``, handed to each Task it registers."""

    def __call__(
        self,
        session: Session,
        task: Task[Any, Any],
        payload: Any,
        **options: Unpack[SubmitOptions],
    ) -> TaskHandle: ...


class SubmitMany(Protocol):
    """How a task records several intents: the App's ``submit_many``."""

    def __call__(
        self,
        session: Session,
        task: Task[Any, Any],
        items: Iterable[tuple[Any, str | None]],
        **options: Unpack[SubmitManyOptions],
    ) -> list[TaskHandle]: ...


class Task(Generic[PayloadT, ResultT]):
    """A registered task: its handler, payload and result types, and delivery policy.

    ``Task[P, R]``: the handler takes a payload ``P`` and returns ``R`` (or an awaitable of
    ``R``); ``on_commit`` hooks receive the ``R``.
    """

    def __init__(
        self,
        fn: Callable[[TaskContext[PayloadT], PayloadT], ResultT | Awaitable[ResultT]],
        *,
        submit: Submit,
        submit_many: SubmitMany,
        name: str,
        queue: str,
        max_attempts: int,
        timeout: timedelta | None,
        retry_on: tuple[type[BaseException], ...],
        flow: TaskFlow = NO_FLOW,
    ) -> None:
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise ConfigurationError(f"task {name!r}: timeout={timeout!r} must be a timedelta over zero, or None")
        exception_classes = isinstance(retry_on, tuple) and all(
            isinstance(e, type) and issubclass(e, BaseException) for e in retry_on
        )
        if not exception_classes:
            raise ConfigurationError(f"task {name!r}: retry_on={retry_on!r} must be a tuple of exception classes")
        self._submit = submit
        self._submit_many = submit_many
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.retry_on = retry_on
        #: Priority and limits (durable_tasks.flow).
        self.flow = flow
        self.is_async = inspect.iscoroutinefunction(fn)
        hints = get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
        if len(params) != 2:
            raise TypeError(f"task {name!r}: a handler takes (ctx, payload), got {params}")
        self.payload_adapter: TypeAdapter[PayloadT] = TypeAdapter(hints.get(params[1], Any))
        self.result_adapter: TypeAdapter[ResultT] = TypeAdapter(hints.get("return", Any))
        self.hooks: list[OnCommitHook[PayloadT, ResultT]] = []
        self.failure_hooks: list[OnFailureHook[PayloadT]] = []

    def submit(
        self,
        session: Session,
        payload: PayloadT | dict[str, Any],
        **options: Unpack[SubmitOptions],
    ) -> TaskHandle:
        """Record the intent in ``session``'s transaction (no commit: the caller commits).

        The same ``idempotency_key`` returns the existing task instead of a second one.
        ``delay`` or ``not_before`` (timezone-aware) make it due later. ``priority`` and
        ``concurrency_key``: see ``App.submit`` (docs/flow-control.md).
        """
        return self._submit(session, self, payload, **options)

    def submit_many(
        self,
        session: Session,
        items: Iterable[tuple[PayloadT | dict[str, Any], str | None]],
        **options: Unpack[SubmitManyOptions],
    ) -> list[TaskHandle]:
        """Record several intents, ``(payload, idempotency_key)`` pairs, in ``session``'s
        transaction (one round trip on PostgreSQL); see ``App.submit_many``."""
        return self._submit_many(session, self, items, **options)

    async def asubmit(
        self,
        session: AsyncSession,
        payload: PayloadT | dict[str, Any],
        **options: Unpack[SubmitOptions],
    ) -> TaskHandle:
        """:meth:`submit` with SQLAlchemy's ``AsyncSession`` (SQLModel's too): the same
        statements on the session's own connection (``AsyncSession.run_sync``), in its
        transaction; the caller commits."""
        return await session.run_sync(
            lambda sync_session: self.submit(cast("Session", sync_session), payload, **options)
        )

    def on_commit(self, hook: OnCommitHook[PayloadT, ResultT]) -> OnCommitHook[PayloadT, ResultT]:
        """Register ``hook(session, ctx, result)`` to run inside the fenced result transaction."""
        self.hooks.append(hook)
        return hook

    def on_failure(self, hook: OnFailureHook[PayloadT]) -> OnFailureHook[PayloadT]:
        """Register ``hook(session, ctx, error)`` to run inside the fenced transaction that
        records the task's final failure (no retries left, or a non-retryable error)."""
        self.failure_hooks.append(hook)
        return hook

    async def run(
        self, ctx: TaskContext[PayloadT], *, limiter: anyio.CapacityLimiter | HandlerThreads | None = None
    ) -> ResultT:
        """Run the handler once (sync handlers in a worker thread: on ``limiter``'s threads when
        it is a :class:`~.handler_threads.HandlerThreads`, the worker's own, else in anyio's
        pool counted by ``limiter``; either way never on the threads its database calls use)."""
        # This asyncio task's (and, copied, its worker thread's) current task, for the run only:
        # left set, the task's context would hold ctx, which (through its attempt) holds the task,
        # a reference cycle only the garbage collector frees.
        token = _current.set(ctx)
        try:
            if self.is_async:
                return await cast("Awaitable[ResultT]", self.fn(ctx, ctx.payload))
            sync_fn = cast("Callable[[TaskContext[PayloadT], PayloadT], ResultT]", self.fn)
            if isinstance(limiter, HandlerThreads):
                return await limiter.run_sync(sync_fn, ctx, ctx.payload)
            return await anyio.to_thread.run_sync(sync_fn, ctx, ctx.payload, abandon_on_cancel=True, limiter=limiter)
        finally:
            _current.reset(token)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"


class TaskDecorator(Protocol):
    """What ``app.task(...)`` returns: registers a handler and gives back its typed Task."""

    @overload
    def __call__(self, fn: Callable[[TaskContext[P], P], Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[[TaskContext[P], P], R], /) -> Task[P, R]: ...


def session_hooks(hooks: Sequence[Callable[..., None]], ctx: TaskContext[Any], value: Any) -> Any:
    """Hooks ``hook(session, ctx, value)`` as one callable on the fenced transaction's
    connection (None when there are none)."""
    if not hooks:
        return None

    def run(conn: sa.Connection) -> None:
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            for hook in hooks:
                hook(session, ctx, value)
            session.commit()  # releases the session's savepoint; the fenced transaction commits later

    return run


_current: ContextVar[TaskContext[Any] | None] = ContextVar("durable_tasks_current_task", default=None)


def current_task() -> TaskContext[Any] | None:
    """The context of the task attempt this code runs in (a tool inside its tool task, a
    handler, code it calls), or None outside one: ``current_task().idempotency_token`` is the
    key to hand downstream systems."""
    return _current.get()
