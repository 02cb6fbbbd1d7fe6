"""Waits on the outside world in the journal: a signal's delivery, and the approvals listing's
read of the waits still open, of some kinds, oldest first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ..journal import StepKind, signal_slot
from ..records import TERMINAL_STATES, steps_table, tasks_table
from .journal import Lock, Resume

__all__ = ["OpenWait", "deliver_signal", "open_waits"]

s = steps_table.c
t = tasks_table.c


@dataclass(frozen=True, slots=True)
class OpenWait:
    """A wait still open (the approvals listing): which task, what it waits for, since when."""

    id: int
    task_id: str
    task_name: str
    generation: int
    name: str
    kind: str
    request_json: str | None
    since: datetime


def open_waits(
    conn: sa.Connection, namespace: str, *, kinds: Sequence[StepKind], limit: int, after_id: int = 0
) -> list[OpenWait]:
    """Open waits of these kinds in the tasks' current generations, oldest first, ``limit``
    at a time after ``after_id`` (keyed paging on the partial index of open rows). A task that
    ended while it waited (cancelled, dead-lettered) keeps its open rows, and waits for nothing."""
    rows = conn.execute(
        sa.select(s.id, s.task_id, t.name, s.generation, s.label, s.kind, s.request, s.created_at)
        .join(tasks_table, sa.and_(t.id == s.task_id, t.generation == s.generation))
        .where(s.namespace == namespace, s.kind.in_([k.value for k in kinds]), s.done.is_(False), s.id > after_id)
        .where(t.state.not_in(TERMINAL_STATES))
        .order_by(s.id)
        .limit(limit)
    ).all()
    return [OpenWait(r.id, r.task_id, r.name, r.generation, r.label, r.kind, r.request, r.created_at) for r in rows]


def deliver_signal(
    conn: sa.Connection,
    namespace: str,
    task_id: str,
    name: str,
    payload_json: str,
    *,
    now: datetime,
    lock: Lock,
    resume: Resume,
) -> bool | None:
    """Deliver a signal to the task's current generation; None when there is no such task,
    False when that signal was delivered before (the first payload stays)."""
    lock(conn, [task_id])
    task = conn.execute(sa.select(t.generation).where(t.id == task_id, t.namespace == namespace)).first()
    if task is None:
        return None
    generation = int(task.generation)
    slot = signal_slot(name)
    row = conn.execute(
        sa.select(s.id, s.done).where(s.task_id == task_id, s.generation == generation, s.slot == slot)
    ).first()
    if row is not None and row.done:
        return False
    if row is not None:
        conn.execute(
            sa.update(steps_table).where(s.id == row.id).values(done=True, result=payload_json, finished_at=now)
        )
        resume(conn, namespace, task_id, generation, now)
        return True
    conn.execute(
        sa.insert(steps_table).values(
            namespace=namespace,
            task_id=task_id,
            generation=generation,
            slot=slot,
            kind=StepKind.SIGNAL,
            label=name[:200],
            done=True,
            result=payload_json,
            created_at=now,
            finished_at=now,
        )
    )
    return True
