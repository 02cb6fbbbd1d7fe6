"""Flow control's SQL (durable_tasks.flow): a delivery refused admission steps aside.

The task gets a new delivery, due when its limit expects room, and nothing else changes: no
attempt is counted (none started), no reclaim or loss is charged. The refused entry is then
acknowledged; the dispatcher publishes the new delivery when it is due, so a waiting task
holds no worker slot and no stream entry while it waits, and survives any restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import sqlalchemy as sa

from ..records import TaskState, tasks_table
from .submit import insert_outbox

__all__ = ["Deferral", "defer_deliveries"]

t = tasks_table.c

#: States in which a delivery waits to run: a deferral moves nothing that is running or final.
_WAITING = [TaskState.PENDING, TaskState.ENQUEUED, TaskState.RETRYING]


class Deferral(NamedTuple):
    """A delivery refused admission, and when it is due again."""

    task_id: str
    generation: int
    delivery: int
    due: datetime


def defer_deliveries(conn: sa.Connection, namespace: str, rows: Sequence[Deferral], now: datetime) -> int:
    """Supersede each delivery with the next one, due at its time; returns how many moved (a
    delivery already superseded, run or final is left alone: its entry is stale anyway)."""
    moved = 0
    for row in sorted(rows):  # in id order, as the dispatcher's mark locks tasks: no deadlock cycle
        updated = conn.execute(
            sa.update(tasks_table)
            .where(
                t.id == row.task_id,
                t.namespace == namespace,
                t.generation == row.generation,
                t.delivery == row.delivery,
                t.state.in_(_WAITING),
            )
            .values(state=TaskState.PENDING, delivery=t.delivery + 1)
        ).rowcount
        if not updated:
            continue
        task = conn.execute(sa.select(t.queue, t.shadow).where(t.id == row.task_id)).one()
        insert_outbox(
            conn, namespace, row.task_id, task.queue, row.generation, row.delivery + 1, task.shadow, now, due=row.due
        )
        moved += 1
    return moved
