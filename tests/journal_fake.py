"""An in-memory journal store and a driver that replays a task the way the runtime does.

Pure logic for unit tests of :mod:`durable_tasks.journal` and the agent adapters: the real
store is tested against real servers in tests/integration. The driver runs a task's handler
under a :class:`Journal`; when it suspends, it runs the pending children (with their tasks'
retry policies) and delivers the signals it was given, then replays the handler as the next
attempt, until the handler returns.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from durable_tasks import App, Task, TaskContext
from durable_tasks.codec import decode_payload, encode_payload
from durable_tasks.journal import (
    ChildOutcome,
    Journal,
    PendingChild,
    PendingSignal,
    PreparedChild,
    RecordedStep,
    StepKind,
    Suspended,
)


@dataclass
class FakeStore:
    """Journal rows by (task id, generation), and what ran."""

    app: App
    rows: dict[tuple[str, int], dict[str, RecordedStep]] = field(default_factory=dict)
    pending: dict[tuple[str, int], tuple[list[PendingChild], list[PendingSignal]]] = field(default_factory=dict)
    executions: Counter[str] = field(default_factory=Counter)
    steps_recorded: int = 0
    suspensions: int = 0

    def backend(self, task_id: str, generation: int) -> FakeBackend:
        return FakeBackend(self, task_id, generation)


@dataclass
class FakeBackend:
    store: FakeStore
    task_id: str
    generation: int

    @property
    def _rows(self) -> dict[str, RecordedStep]:
        return self.store.rows.setdefault((self.task_id, self.generation), {})

    async def load(self) -> Sequence[RecordedStep]:
        return list(self._rows.values())

    async def record_step(self, slot: str, label: str, result_json: str) -> str:
        existing = self._rows.get(slot)
        if existing is not None and existing.result_json is not None:
            return existing.result_json
        self._rows[slot] = RecordedStep(slot, StepKind.STEP, True, result_json)
        self.store.steps_recorded += 1
        return result_json

    def prepare_child(self, task: Any, payload: Any) -> PreparedChild:
        found: Task[Any, Any] = self.store.app.registry[task if isinstance(task, str) else task.name]
        s = self.store.app.settings
        return PreparedChild(
            found.name,
            encode_payload(
                found.payload_adapter,
                payload,
                task=found.name,
                max_bytes=s.max_payload_bytes,
                max_depth=s.max_json_depth,
            ),
        )

    async def suspend(self, children: Sequence[PendingChild], signals: Sequence[PendingSignal]) -> Suspended:
        self.store.suspensions += 1
        for child in children:
            self._rows.setdefault(child.slot, RecordedStep(child.slot, StepKind.CHILD, False))
        for signal in signals:
            self._rows.setdefault(signal.slot, RecordedStep(signal.slot, signal.kind, False))
        self.store.pending[(self.task_id, self.generation)] = (list(children), list(signals))
        return Suspended.WAITING


@dataclass
class Run:
    """What :func:`drive` saw: the result (None while waiting), attempts, the started children in
    start order, and the signal waits still open."""

    result: Any = None
    attempts: int = 0
    started: list[str] = field(default_factory=list)
    waiting_for: list[PendingSignal] = field(default_factory=list)


async def drive(
    store: FakeStore,
    task: Task[Any, Any],
    payload: Any,
    *,
    task_id: str = "run-1",
    generation: int = 0,
    signals: Mapping[str, Any] | None = None,
    resume: bool = False,
    max_attempts: int = 30,
) -> Run:
    """Run ``task`` until it returns, or until it waits for a signal nobody gave; ``resume``
    carries on a run that waited (its first attempt here is not the generation's first)."""
    run = Run()
    given = dict(signals or {})
    key = (task_id, generation)
    for slot, row in store.rows.get(key, {}).items():  # signals given to a waiting run
        name = slot.removeprefix("signal:")
        if not row.done and name in given:
            store.rows[key][slot] = RecordedStep(slot, row.kind, True, json.dumps(given[name]))
    while run.attempts < max_attempts:
        run.attempts += 1
        first = run.attempts == 1 and not resume
        journal = Journal(store.backend(task_id, generation), task_id, generation, first_attempt=first)
        ctx = _context(task, task_id, generation, run.attempts, payload)
        store.executions[task.name] += 1
        result, suspended = await journal.run(partial(_call, task, ctx))
        if suspended is None:
            run.result = result
            return run
        children, waits = store.pending.pop(key)
        rows = store.rows[key]
        for child in children:
            run.started.append(child.label)
            rows[child.slot] = RecordedStep(child.slot, StepKind.CHILD, True, child=await _run_child(store, child))
        run.waiting_for = [w for w in waits if w.name not in given]
        for wait in waits:
            if wait.name in given:
                rows[wait.slot] = RecordedStep(wait.slot, wait.kind, True, json.dumps(given[wait.name]))
        if run.waiting_for:
            return run
    raise AssertionError(f"{task.name} did not finish in {max_attempts} attempts")


def _context(task: Task[Any, Any], task_id: str, generation: int, attempt: int, payload: Any) -> TaskContext[Any]:
    return TaskContext(
        task_id=task_id,
        name=task.name,
        queue=task.queue,
        generation=generation,
        attempt=attempt,
        delivery=attempt - 1,
        idempotency_key=None,
        payload=payload,
    )


async def _call(task: Task[Any, Any], ctx: TaskContext[Any]) -> Any:
    return await task.run(ctx)


async def _run_child(store: FakeStore, child: PendingChild) -> ChildOutcome:
    task = store.app.registry[child.prepared.task_name]
    payload = decode_payload(task.payload_adapter, child.prepared.payload_json, task=task.name)
    error: BaseException | None = None
    for attempt in range(1, task.max_attempts + 1):
        store.executions[task.name] += 1
        ctx = _context(task, f"child:{child.slot}", 0, attempt, payload)
        try:
            result = await task.run(ctx)
        except Exception as exc:
            error = exc
            if task.retry_on and not isinstance(exc, task.retry_on):
                break
            continue
        return ChildOutcome("SUCCEEDED", json.dumps(task.result_adapter.dump_python(result, mode="json")))
    assert error is not None
    return ChildOutcome("FAILED", None, type(error).__qualname__, str(error))
