"""The approvals listing's read of the journal: waits still open, of some kinds, oldest first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ..journal import StepKind
from ..records import steps_table, tasks_table

__all__ = ["OpenWait", "open_waits"]

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
    at a time after ``after_id`` (keyed paging on the partial index of open rows)."""
    rows = conn.execute(
        sa.select(s.id, s.task_id, t.name, s.generation, s.label, s.kind, s.request, s.created_at)
        .join(tasks_table, sa.and_(t.id == s.task_id, t.generation == s.generation))
        .where(s.namespace == namespace, s.kind.in_([k.value for k in kinds]), s.done.is_(False), s.id > after_id)
        .order_by(s.id)
        .limit(limit)
    ).all()
    return [OpenWait(r.id, r.task_id, r.name, r.generation, r.label, r.kind, r.request, r.created_at) for r in rows]
