"""The step journal: long work that replays instead of re-running, and waits without a slot.

A task's handler may record *steps* (a model call, a clock read, anything that must not run twice
for one generation), submit *child tasks* and wait for their outcome, and wait for named *signals*
from outside (an approval). All three live in one table, ``dt_steps``, unique per
``(task_id, generation, slot)``; every write is fenced like a result, so only the attempt that
owns the task writes its journal.

The API a handler (or an agent-framework adapter) uses, through ``ctx.journal`` or
:func:`current_journal` (the journal of the attempt running in this asyncio task)::

    response = await journal.step("model", call_model)             # recorded once per generation
    outcome = await journal.child(tool_task, args, label="tool:search:call_1", order=0)
    decision = await journal.wait_signal("approval:call_2", kind="approval", request={...})
    run_id = journal.deterministic_id("run")                       # the same on every replay
    n = journal.sequence("event")                                   # 0, 1, 2... in call order

**Slots.** A step or child call gets the slot ``{kind}:{label}#{n}``: ``n`` counts earlier calls
with the same label in this attempt, so slots follow call order, and calls made in parallel
with distinct labels (a tool call id in the label) get the same slots on every replay whatever
order they arrive in. A signal's slot is ``signal:{name}``: a signal is a named fact of the
generation, and waiting on it twice returns the same payload.

**Replay.** A later attempt of the same generation (a retry, a redelivery after a crash, a
resume after a wait) runs the handler again from the top. A recorded step returns its recorded
result without running; a settled child returns its recorded outcome; a delivered signal
returns its payload. The first attempt of a generation has nothing to replay, and reads nothing.
A rerun (a new generation) starts with an empty journal.

**Waiting without a slot.** A child call or a signal wait that has no outcome yet registers a
*pending wait* and blocks. Once every branch of the handler is blocked on a pending wait and no
step is running, the runtime cancels the handler and, in ONE fenced transaction, submits the
children (in ``order``, then call order: ordered starts for parallel tool calls; each child's
idempotency key is ``task_id:generation:slot``), records the waits and moves the task to
WAITING: no worker slot, no lease. The last child to settle (its fenced final write, or its
dead-lettering or cancellation) or the awaited signal moves the task back to PENDING as a new
delivery of the same generation, and the handler replays. If everything awaited had settled
by the time of the suspension, the task is redelivered at once.

**Failures.** A step that raises records nothing: the task's retry policy applies and the next
attempt runs it again. A child that ended FAILED, DEAD or CANCELLED raises
:class:`~.errors.ChildTaskFailedError` in the parent, which does not retry (the journal would
replay the same outcome); an adapter may catch it and hand the error to the model instead.

Only async handlers use the journal (a sync handler has no event loop to block in).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError

from .errors import ChildTaskFailedError, ResultNotSerializableError, SignalError
from .journal_records import (
    ChildOutcome,
    JournalBackend,
    PendingChild,
    PendingSignal,
    PreparedChild,
    RecordedStep,
    StepKind,
    Suspended,
)
from .settings import printable_text

__all__ = [
    "ChildOutcome",
    "Journal",
    "JournalBackend",
    "JournalSource",
    "PendingChild",
    "PendingSignal",
    "PreparedChild",
    "RecordedStep",
    "StepKind",
    "Suspended",
    "check_signal_name",
    "current_journal",
    "end_journal_source",
    "journal_source",
    "signal_slot",
    "using_journal",
]

#: Labels longer than this are cut and suffixed with a digest (slots are part of idempotency keys).
MAX_LABEL = 120
#: Event-loop turns the runtime gives the handler's branches to reach their waits before it
#: decides they are all blocked (parallel tool calls started together get there in a few).
QUIET_TURNS = 20
#: Then this long with nothing new, for branches that wait on something else in between (a
#: thread hop); one that waits longer only costs an extra suspension, never a wrong result.
SETTLE_S = 0.005


class JournalSource(Protocol):
    """What makes an attempt's journal on first use (a worker's attempt; see :mod:`.journaled`)."""

    def journal(self) -> Journal | None:
        """The attempt's journal, made on the first call (None: the attempt has none)."""
        ...


_current: ContextVar[Journal | JournalSource | None] = ContextVar("durable_tasks_journal", default=None)


def current_journal() -> Journal | None:
    """The journal of the task attempt running in this asyncio task (None outside one)."""
    current = _current.get()
    if current is None or isinstance(current, Journal):
        return current
    return current.journal()


def journal_source(source: JournalSource) -> Token[Journal | JournalSource | None]:
    """Make ``source``'s journal current in this asyncio task (and in the tasks it starts from
    now on), made only if something asks for it; :func:`end_journal_source` with the token
    returned ends that when the attempt ends."""
    return _current.set(source)


def end_journal_source(token: Token[Journal | JournalSource | None]) -> None:
    """Undo :func:`journal_source`, in the same asyncio task. Until then the task's context holds
    the source, and a worker's attempt (the source) holds its task: a reference cycle that only
    the garbage collector would free, one per attempt."""
    _current.reset(token)


@dataclass(eq=False, slots=True)
class Journal:
    """One attempt's view of the journal: replays recorded rows, records new ones, collects waits."""

    backend: JournalBackend
    task_id: str
    generation: int
    first_attempt: bool
    _recorded: dict[str, RecordedStep] = field(default_factory=dict)
    _loaded: bool = False
    _counters: dict[str, int] = field(default_factory=dict)
    _children: list[PendingChild] = field(default_factory=list)
    _signals: list[PendingSignal] = field(default_factory=list)
    _in_flight: int = 0
    _version: int = 0
    _seq: int = 0
    # Made when first needed: most attempts never wait nor replay, and every object an
    # attempt holds while it runs is one more for the garbage collector to walk.
    _changed: asyncio.Event | None = None  # set on every change once the watcher runs
    _load_lock: asyncio.Lock | None = None  # one load of the recorded rows per replaying attempt
    _host: asyncio.Task[Any] | None = None  # the task running the handler (cancelled to suspend it)
    _watcher: asyncio.Future[None] | None = None  # started by the first wait (see _block)
    _stuck: bool = False  # the watcher found every branch blocked and cancelled the handler

    # -- the handler's side --------------------------------------------------------------

    async def step(self, label: str, fn: Callable[[], Awaitable[Any] | Any], *, result_type: Any = None) -> Any:
        """Run ``fn`` once per generation and record its JSON result; a replay returns the
        recorded value. ``result_type`` (any pydantic-compatible type) encodes and decodes it;
        without it the result must be plain JSON."""
        slot = self._slot(StepKind.STEP, label)
        adapter: TypeAdapter[Any] | None = TypeAdapter(result_type) if result_type is not None else None
        self._begin()
        try:
            recorded = await self._lookup(slot)
            if recorded is not None and recorded.done and recorded.result_json is not None:
                return _decode(adapter, recorded.result_json)
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            stored = await self.backend.record_step(slot, label, _encode(adapter, value, label))
            return _decode(adapter, stored)
        finally:
            self._end()

    async def child(self, task: Any, payload: Any, *, label: str | None = None, order: int | None = None) -> Any:
        """Run ``task`` as a child with ``payload`` and return its result (decoded JSON).

        Raises :class:`~.errors.ChildTaskFailedError` when the child ended FAILED, DEAD or
        CANCELLED. ``order`` ranks children started together (lower first)."""
        name = task if isinstance(task, str) else task.name
        slot = self._slot(StepKind.CHILD, label or name)
        prepared = self.backend.prepare_child(task, payload)  # a bad payload fails the caller now
        self._begin()
        try:
            recorded = await self._lookup(slot)
        finally:
            self._end()
        if recorded is not None and recorded.done:
            return _child_result(slot, recorded)
        self._children.append(PendingChild(slot, label or name, prepared, self._order(order)))
        return await self._block()

    async def wait_signal(
        self, name: str, *, kind: StepKind = StepKind.SIGNAL, request: Any = None, order: int | None = None
    ) -> Any:
        """Wait for ``app.signal(task_id, name, payload)`` and return the payload (decoded JSON);
        ``request`` (JSON) says what is asked, for whoever answers (the approvals CLI shows it)."""
        slot = signal_slot(check_signal_name(name))
        self._begin()
        try:
            recorded = await self._lookup(slot)
        finally:
            self._end()
        if recorded is not None and recorded.done and recorded.result_json is not None:
            return json.loads(recorded.result_json)
        request_json = None if request is None else json.dumps(request, allow_nan=False)
        self._signals.append(PendingSignal(slot, name, kind, request_json, self._order(order)))
        return await self._block()

    def sequence(self, label: str) -> int:
        """How many times this attempt asked for ``label`` before (0 first): numbers that every
        replay of the generation hands out again in the same order."""
        key = f"seq:{label}"
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        return n

    def deterministic_id(self, label: str) -> str:
        """``task_id:generation:label#n``: an id that every replay of this generation derives again."""
        return f"{self.task_id}:{self.generation}:{label}#{self.sequence(label)}"

    # -- the runtime's side --------------------------------------------------------------

    async def run(self, handler: Callable[[], Awaitable[Any]]) -> tuple[Any, Suspended | None]:
        """Run ``handler`` with this journal current: (result, None), or (None, how it suspended) once
        every branch is blocked on a wait (watched from the first wait on); exceptions propagate.

        The handler runs in the calling task (a task of its own would cost every attempt more
        than a no-op handler does). The watcher cancels this task when it finds every branch
        blocked, and ``run`` takes that one cancellation back (``uncancel``): a cancellation
        from outside (a timeout, a stopping worker) still propagates. (A worker runs its
        handlers without ``run``: a journal made on first use, and the same three steps.)"""
        self._host = asyncio.current_task()
        assert self._host is not None, "Journal.run runs in an asyncio task"
        token = _current.set(self)
        try:
            result = await handler()
        except asyncio.CancelledError:
            if not self.took_back_cancellation():
                raise  # cancelled from outside (a timeout, a stopping worker), not suspended
            result = None
        else:
            self.took_back_cancellation()  # the handler may have swallowed the watcher's
        finally:
            _current.reset(token)
            self.stop_watching()
        return await self.outcome(result)

    def took_back_cancellation(self) -> bool:
        """After the handler ended: whether its host task was cancelled by the watcher alone (a
        suspension), that cancellation now taken back; False when there was none, or when the
        host was cancelled from outside too (then the cancellation must propagate)."""
        return self._stuck and self._host is not None and self._host.uncancel() == 0

    def stop_watching(self) -> None:
        """After the handler ended: stop the watcher, if a wait started one."""
        if self._watcher is not None:
            self._watcher.cancel()

    async def outcome(self, result: Any) -> tuple[Any, Suspended | None]:
        """After the handler ended with ``result``: (result, None), or, when the watcher found
        every branch blocked, (None, how it suspended) once the waits are recorded."""
        if not self._stuck:
            return result, None
        ordered_children = sorted(self._children, key=lambda c: c.order)
        ordered_signals = sorted(self._signals, key=lambda s: s.order)
        return None, await self.backend.suspend(ordered_children, ordered_signals)

    async def _watch(self) -> None:
        """Cancel the handler once every branch is blocked (``run`` goes on once its branches unwound)."""
        changed = self._changed
        assert changed is not None  # made by _block before it starts the watcher
        while True:
            await changed.wait()
            changed.clear()
            if not self._blocked():
                continue
            seen = self._version
            for _ in range(QUIET_TURNS):
                await asyncio.sleep(0)
            await asyncio.sleep(SETTLE_S)
            if self._blocked() and self._version == seen:
                break
        self._stuck = True
        if self._host is not None:
            self._host.cancel()

    # -- internals -----------------------------------------------------------------------

    def _blocked(self) -> bool:
        return bool(self._children or self._signals) and self._in_flight == 0

    def _slot(self, kind: StepKind, label: str) -> str:
        key = f"{kind.value}:{_bounded(label)}"
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        return f"{key}#{n}"

    def _order(self, order: int | None) -> tuple[int, int]:
        self._seq += 1
        return (order if order is not None else 1 << 30, self._seq)

    def _begin(self) -> None:
        self._in_flight += 1
        self._touch()

    def _end(self) -> None:
        self._in_flight -= 1
        self._touch()

    def _touch(self) -> None:
        self._version += 1
        if self._changed is not None:
            self._changed.set()

    async def _block(self) -> Any:
        if self._watcher is None:
            self._changed = asyncio.Event()
            self._watcher = asyncio.ensure_future(self._watch())
        self._touch()
        await asyncio.Event().wait()  # never set: the suspension cancels this branch
        raise AssertionError("unreachable")  # pragma: no cover

    async def _lookup(self, slot: str) -> RecordedStep | None:
        if self.first_attempt:
            return None  # the first attempt of a generation has nothing to replay
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            if not self._loaded:
                self._recorded = {row.slot: row for row in await self.backend.load()}
                self._loaded = True
        return self._recorded.get(slot)


@contextmanager
def using_journal(journal: Journal) -> Iterator[Journal]:
    """Make ``journal`` current for the code inside (code run outside :meth:`Journal.run`)."""
    token = _current.set(journal)
    try:
        yield journal
    finally:
        _current.reset(token)


def signal_slot(name: str) -> str:
    """The journal slot of the signal ``name`` (one per generation)."""
    return f"signal:{_bounded(name)}"


def check_signal_name(name: str) -> str:
    """``name`` if it can name a signal (a printable string of 1-200 characters), else
    SignalError: a NUL byte or a lone surrogate is no text a database stores alike."""
    if not printable_text(name, 200):
        raise SignalError(f"signal name {str(name)[:40]!r}: pass a printable string of 1-200 characters")
    return name


def _bounded(label: str) -> str:
    if len(label) <= MAX_LABEL:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:16]
    return f"{label[: MAX_LABEL - 17]}~{digest}"


def _encode(adapter: TypeAdapter[Any] | None, value: Any, label: str) -> str:
    """A step's value as JSON text, or ResultNotSerializableError (the task fails unretried, as
    for a result: running the step again would give the same value)."""
    try:
        return adapter.dump_json(value).decode() if adapter is not None else json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, PydanticSerializationError) as exc:
        raise ResultNotSerializableError(f"step {label!r} returned a value that is not plain JSON: {exc}") from exc


def _decode(adapter: TypeAdapter[Any] | None, text: str) -> Any:
    return adapter.validate_json(text) if adapter is not None else json.loads(text)


def _child_result(slot: str, recorded: RecordedStep) -> Any:
    outcome = recorded.child
    if outcome is None or outcome.state != "SUCCEEDED":
        state = outcome.state if outcome else "FAILED"
        raise ChildTaskFailedError(
            slot,
            state,
            outcome.error_type if outcome else None,
            outcome.error_message if outcome else None,
        )
    return json.loads(outcome.result_json) if outcome.result_json is not None else None
