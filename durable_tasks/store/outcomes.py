"""The read behind a result wait: the state and outcome of a group of tasks, by id.

One statement for the whole group (the waits of a process poll together), by primary key;
portable SQL, the same on every dialect.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from ..outcome import TaskOutcome
from ..records import TaskState, tasks_table
from .planning import tasks_by_id

__all__ = ["MAX_IDS_PER_READ", "read_identity", "read_outcomes"]

#: Ids per statement: far below every dialect's bound-parameter limit.
MAX_IDS_PER_READ = 500

t = tasks_table.c


def read_outcomes(engine: sa.Engine, namespace: str, task_ids: Sequence[str]) -> dict[str, TaskOutcome]:
    """What the database says of each task (absent ids: no such task in ``namespace``)."""
    found: dict[str, TaskOutcome] = {}
    with engine.connect() as conn:
        for start in range(0, len(task_ids), MAX_IDS_PER_READ):
            chunk = list(task_ids[start : start + MAX_IDS_PER_READ])
            rows = conn.execute(
                sa.select(t.id, t.generation, t.state, t.result, t.error_type, t.error_message).where(
                    tasks_by_id(namespace, chunk)
                )
            )
            for task_id, generation, state, result, error_type, error_message in rows:
                found[task_id] = TaskOutcome(task_id, generation, TaskState(state), result, error_type, error_message)
    return found


def read_identity(engine: sa.Engine, namespace: str, task_id: str) -> tuple[str, int] | None:
    """The task's name and current generation (None: no such task in ``namespace``)."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.name, t.generation).where(t.namespace == namespace, t.id == task_id)).first()
    return None if row is None else (row.name, row.generation)
