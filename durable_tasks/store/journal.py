"""The step journal's SQL (``dt_steps``): recorded steps, suspension, children's outcomes,
and the resume of a WAITING task (a signal's delivery: :mod:`.waits`). Core statements on a
connection; the store runs them in its transactions and supplies what its dialect does
differently (locking a task row, submitting a child, waking dispatchers).

Every write that concerns one task happens under that task's row lock: the attempt's fenced
UPDATE (record a step, suspend), or the store's lock (a child's outcome, a signal). So exactly
one of "the task suspends" and "its last awaited thing settles" sees the other, and the task
is resumed once: the suspension finds nothing open and redelivers at once, or the last settle
finds the task WAITING and resumes it. A resume is a new delivery of the same generation
(``delivery + 1``, an outbox row), like a reaper's redelivery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..journal import ChildOutcome, PendingChild, PendingSignal, RecordedStep, StepKind, Suspended
from ..records import TERMINAL_STATES, AttemptOutcome, TaskState, attempts_table, steps_table, tasks_table
from .execution import ExecutionClaim
from .outbox import NewDelivery
from .submit import NewTask, SubmitOutcome, insert_outbox

__all__ = [
    "child_task",
    "finish_suspension",
    "load_steps",
    "open_children",
    "record_step",
    "recorded_result",
    "resume_if_ready",
    "settle_child",
    "settle_if_child",
    "suspend",
    "wait_fenced",
]

t = tasks_table.c
s = steps_table.c
a = attempts_table.c

#: ``lock(conn, task_ids)``: the store's row lock (FOR UPDATE; a no-op where transactions are
#: serialized), as :func:`.waits.deliver_signal` takes it.
Lock = Callable[[sa.Connection, Sequence[str]], None]
#: ``wake(conn, namespace)``: tell dispatchers an outbox row was written.
Wake = Callable[[sa.Connection, str], None]
#: ``resume(conn, namespace, task_id, generation, now)``: :func:`resume_if_ready`, as the store
#: runs it (PostgreSQL: one statement).
Resume = Callable[[sa.Connection, str, str, int, datetime], NewDelivery | None]
#: ``settle(conn, namespace, parent_id, parent_generation, slot, outcome, now)``:
#: :func:`settle_child`, as the store runs it (PostgreSQL: one statement).
Settle = Callable[[sa.Connection, str, str, int, str, ChildOutcome, datetime], NewDelivery | None]
#: ``wait(conn, claim, now)``: :func:`wait_fenced`, as the store runs it (PostgreSQL: one statement).
Wait = Callable[[sa.Connection, ExecutionClaim, datetime], bool]
#: ``submit(conn, tasks, now)``: the store's submit of a suspension's children, in order
#: (idempotent by key, waking dispatchers; PostgreSQL: one statement).
SubmitChildren = Callable[[sa.Connection, Sequence[NewTask], datetime], Sequence[SubmitOutcome]]
#: A resumed task's new delivery: the columns of a NewDelivery (its id apart), read back.
_DELIVERY_COLUMNS = [t[f.name] for f in fields(NewDelivery) if f.name != "task_id"]


def child_task(
    claim: ExecutionClaim,
    child: PendingChild,
    *,
    queue: str,
    max_attempts: int,
    priority: int | None = None,
    due: datetime | None = None,
) -> NewTask:
    """The child's task row: idempotency key ``task_id:generation:slot`` (one child per slot and
    generation, however often a suspension is retried) and the link back to the parent; its
    task's priority and the dispatch due time that goes with it, as a submit writes them."""
    return NewTask(
        namespace=claim.namespace,
        name=child.prepared.task_name,
        queue=queue,
        payload_json=child.prepared.payload_json,
        idempotency_key=f"{claim.task_id}:{claim.generation}:{child.slot}",
        max_attempts=max_attempts,
        traceparent=claim.traceparent,
        shadow=claim.shadow,
        priority=priority,
        due=due,
        parent_id=claim.task_id,
        parent_generation=claim.generation,
        parent_slot=child.slot,
    )


def load_steps(conn: sa.Connection, task_id: str, generation: int) -> list[RecordedStep]:
    """Every journal row of the task's generation."""
    rows = conn.execute(
        sa.select(
            s.slot, s.kind, s.done, s.result, s.child_state, s.error_type, s.error_message, s.child_task_id
        ).where(s.task_id == task_id, s.generation == generation)
    ).all()
    return [_recorded(r) for r in rows]


def _recorded(r: Any) -> RecordedStep:
    kind = StepKind(r.kind)
    if kind is StepKind.CHILD:
        child = ChildOutcome(r.child_state, r.result, r.error_type, r.error_message) if r.done else None
        return RecordedStep(r.slot, kind, bool(r.done), None, child)
    return RecordedStep(r.slot, kind, bool(r.done), r.result)


def _own(conn: sa.Connection, claim: ExecutionClaim, now: datetime, lease: timedelta) -> bool:
    """The attempt's fence, as an UPDATE that extends its lease and locks the task row."""
    return bool(conn.execute(sa.update(tasks_table).where(claim.fence()).values(lease_expires_at=now + lease)).rowcount)


def record_step(
    conn: sa.Connection,
    claim: ExecutionClaim,
    slot: str,
    label: str,
    result_json: str,
    *,
    now: datetime,
    lease: timedelta,
) -> str | None:
    """Record a step's result under the attempt's fence; returns the recorded result (a row
    already there wins), or None when the attempt no longer owns the task. The fence's UPDATE
    locks the task row, so no other write of the slot can come between the insert's test for a
    row and the insert: the slot is read only when it was taken."""
    if not _own(conn, claim, now, lease):
        return None
    key = {"task_id": claim.task_id, "generation": claim.generation, "slot": slot}
    values = {"namespace": claim.namespace, "kind": StepKind.STEP, "label": label[:200], "done": True}
    if conn.execute(_RECORD_STEP, {**key, **values, "result": result_json, "at": now}).rowcount:
        return result_json
    return recorded_result(conn, claim, slot)


def recorded_result(conn: sa.Connection, claim: ExecutionClaim, slot: str) -> str:
    """The result a step's slot already holds (an insert found it taken)."""
    key = {"task_id": claim.task_id, "generation": claim.generation, "slot": slot}
    existing = conn.execute(sa.select(s.result).where(*(s[k] == v for k, v in key.items()))).scalar_one()
    if existing is None:  # pragma: no cover - a step's slot never names a wait
        raise RuntimeError(f"journal slot {slot!r} of task {claim.task_id} holds a wait, not a step")
    return str(existing)


def _step_values() -> sa.Select[Any]:
    """The new step's row as a SELECT of parameters, of the slot if it has no row yet."""
    named = ["namespace", "task_id", "generation", "slot", "kind", "label", "done", "result"]
    columns = [sa.bindparam(name, type_=s[name].type) for name in named]
    at = sa.bindparam("at", type_=s.created_at.type)
    taken = sa.exists().where(*(s[k] == sa.bindparam(k, type_=s[k].type) for k in ("task_id", "generation", "slot")))
    return sa.select(*columns, at, at).where(~taken)


#: Built once (:mod:`.submit` builds its inserts so too): the insert of a step, unless its slot has a row.
_RECORD_STEP = sa.insert(steps_table).from_select(
    ["namespace", "task_id", "generation", "slot", "kind", "label", "done", "result", "created_at", "finished_at"],
    _step_values(),
)


def suspend(
    conn: sa.Connection,
    claim: ExecutionClaim,
    children: Sequence[tuple[PendingChild, NewTask]],
    signals: Sequence[PendingSignal],
    *,
    now: datetime,
    submit_children: SubmitChildren,
    wait: Wait,
    resume: Resume,
) -> Suspended | None:
    """Submit the children (in the given order), open the waits, and move the task to WAITING,
    or redeliver it when everything awaited has settled already; None when fenced out.

    The waits' rows go in one INSERT. Only a slot that may have a row already is looked for
    (one SELECT): a child found rather than created (an earlier suspension's), a signal (it
    may have been delivered). A wait opened now is open, so the task cannot be ready: only a
    suspension that opened none looks for an open wait left."""
    if not wait(conn, claim, now):
        return None
    opened: dict[str, dict[str, Any]] = {}  # slot -> its row, unless the slot has one already
    found: dict[str, str] = {}  # slot -> the child found rather than created
    submitted = submit_children(conn, [task for _, task in children], now) if children else []
    for (child, _), outcome in zip(children, submitted, strict=True):
        opened[child.slot] = _wait_row(
            claim, child.slot, StepKind.CHILD, child.label, now, child_task_id=outcome.task_id
        )
        if not outcome.created:
            found[child.slot] = outcome.task_id
    for signal in signals:
        opened[signal.slot] = _wait_row(claim, signal.slot, signal.kind, signal.name, now, request=signal.request_json)
    if maybe_there := [*found, *(signal.slot for signal in signals)]:
        mine = sa.and_(s.task_id == claim.task_id, s.generation == claim.generation)
        for slot in conn.execute(sa.select(s.slot).where(mine, s.slot.in_(maybe_there))).scalars():
            del opened[slot]
    if opened:
        conn.execute(sa.insert(steps_table), list(opened.values()))
    waits_opened = any(slot not in found for slot in opened)
    return finish_suspension(conn, claim, found, waits_opened=waits_opened, now=now, resume=resume)


def finish_suspension(
    conn: sa.Connection,
    claim: ExecutionClaim,
    found: Mapping[str, str],
    *,
    waits_opened: bool,
    now: datetime,
    resume: Resume,
) -> Suspended:
    """A suspension's end, once its waits' rows are written: a child found rather than created
    (``found``: slot -> child, an earlier suspension's) may have ended meanwhile, and its slot
    settles now. A wait opened now is open, so the task waits; a suspension that opened none
    redelivers its task when no wait is left open."""
    for slot, child_id in found.items():
        if (outcome := _final_outcome(conn, child_id)) is not None:
            _settle_row(conn, claim.task_id, claim.generation, slot, outcome, now)
    if waits_opened:
        return Suspended.WAITING
    if resume(conn, claim.namespace, claim.task_id, claim.generation, now):
        return Suspended.REDELIVERED
    return Suspended.WAITING


def wait_fenced(conn: sa.Connection, claim: ExecutionClaim, now: datetime) -> bool:
    """A suspension's start: the attempt's fence moves its task to WAITING and closes the
    attempt as suspended; False, writing nothing, when the attempt no longer owns the task."""
    waiting = conn.execute(
        sa.update(tasks_table).where(claim.fence()).values(state=TaskState.WAITING, lease_expires_at=None)
    ).rowcount
    if waiting:
        _close_attempt(conn, claim, now)
    return bool(waiting)


def _wait_row(
    claim: ExecutionClaim,
    slot: str,
    kind: StepKind,
    label: str,
    now: datetime,
    *,
    child_task_id: str | None = None,
    request: str | None = None,
) -> dict[str, Any]:
    """The journal row of a wait opened now."""
    mine = {"namespace": claim.namespace, "task_id": claim.task_id, "generation": claim.generation, "slot": slot}
    opened = {"kind": kind, "label": label[:200], "done": False, "created_at": now}
    return mine | opened | {"child_task_id": child_task_id, "request": request}


def _final_outcome(conn: sa.Connection, task_id: str) -> ChildOutcome | None:
    row = conn.execute(sa.select(t.state, t.result, t.error_type, t.error_message).where(t.id == task_id)).first()
    if row is None or row.state not in TERMINAL_STATES:
        return None
    return ChildOutcome(row.state, row.result, row.error_type, row.error_message)


def _close_attempt(conn: sa.Connection, claim: ExecutionClaim, now: datetime) -> None:
    conn.execute(
        sa.update(attempts_table)
        .where(a.task_id == claim.task_id, a.generation == claim.generation, a.attempt == claim.attempt)
        .values(outcome=AttemptOutcome.SUSPENDED, finished_at=now)
    )


def _settle_row(
    conn: sa.Connection, task_id: str, generation: int, slot: str, outcome: ChildOutcome, now: datetime
) -> bool:
    return bool(
        conn.execute(
            sa.update(steps_table)
            .where(s.task_id == task_id, s.generation == generation, s.slot == slot, s.done.is_(False))
            .values(
                done=True,
                child_state=outcome.state,
                result=outcome.result_json,
                error_type=outcome.error_type,
                error_message=outcome.error_message,
                finished_at=now,
            )
        ).rowcount
    )


def settle_child(
    conn: sa.Connection,
    namespace: str,
    *,
    parent_id: str,
    parent_generation: int,
    slot: str,
    outcome: ChildOutcome,
    now: datetime,
    resume: Resume,
) -> NewDelivery | None:
    """Record a child's final outcome in its parent's journal (in the child's final transaction,
    which locked the parent's row with the child's, in id order) and resume the parent if it
    was the last thing it waited for. A parent that moved to a newer generation ignores it (a
    superseded branch's late result is fenced out). Returns the parent's new delivery when
    this resumed it."""
    if not _settle_row(conn, parent_id, parent_generation, slot, outcome, now):
        return None
    return resume(conn, namespace, parent_id, parent_generation, now)


def settle_if_child(
    conn: sa.Connection, namespace: str, task_id: str, state: str, now: datetime, *, settle: Settle
) -> None:
    """After a task ended without a result (dead-lettered, cancelled): settle its parent's slot
    if it is a child (the transaction locked both rows first, as :func:`settle_child` says)."""
    row = conn.execute(
        sa.select(t.parent_id, t.parent_generation, t.parent_slot, t.error_type, t.error_message).where(t.id == task_id)
    ).first()
    if row is None or row.parent_id is None:
        return
    outcome = ChildOutcome(state, None, row.error_type, row.error_message)
    settle(conn, namespace, row.parent_id, row.parent_generation, row.parent_slot, outcome, now)


def open_children(conn: sa.Connection, task_id: str) -> list[str]:
    """The children the task's journal still waits for, in every generation, in id order."""
    ids = conn.execute(
        sa.select(s.child_task_id).where(s.task_id == task_id, s.kind == StepKind.CHILD, s.done.is_(False))
    ).scalars()
    return sorted({child_id for child_id in ids if child_id})


def resume_if_ready(
    conn: sa.Connection, namespace: str, task_id: str, generation: int, now: datetime, *, wake: Wake
) -> NewDelivery | None:
    """A WAITING task with no open wait left becomes PENDING as a new delivery of the same
    generation (the caller holds the task row's lock); that delivery, or None."""
    still_open = conn.execute(
        sa.select(s.id).where(s.task_id == task_id, s.generation == generation, s.done.is_(False)).limit(1)
    ).first()
    if still_open is not None:
        return None
    updated = conn.execute(
        sa.update(tasks_table)
        .where(
            t.id == task_id,
            t.namespace == namespace,
            t.generation == generation,
            t.state == TaskState.WAITING,
        )
        .values(state=TaskState.PENDING, delivery=t.delivery + 1, lease_expires_at=None, worker_id=None)
    ).rowcount
    if not updated:
        return None
    # The row just updated (and locked): an UPDATE, then a read, on every dialect.
    row = conn.execute(sa.select(*_DELIVERY_COLUMNS).where(t.id == task_id)).one()
    insert_outbox(conn, namespace, task_id, row.queue, generation, row.delivery, row.shadow, now)
    wake(conn, namespace)
    return NewDelivery(task_id=task_id, **row._mapping)
