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

from ..records import TaskState, outbox_table, tasks_table
from .submit import outbox_row

__all__ = ["Deferral", "defer_deliveries"]

t = tasks_table.c

#: States in which a delivery waits to run: a deferral moves nothing that is running or final.
_WAITING = frozenset({TaskState.PENDING, TaskState.ENQUEUED, TaskState.RETRYING})

#: Tasks per statement (bound parameters stay far below every dialect's limit).
_CHUNK = 500


class Deferral(NamedTuple):
    """A delivery refused admission, and when it is due again."""

    task_id: str
    generation: int
    delivery: int
    due: datetime


def defer_deliveries(conn: sa.Connection, namespace: str, rows: Sequence[Deferral], now: datetime) -> int:
    """Supersede each delivery with the next one, due at its time; returns how many moved (a
    delivery already superseded, run or final is left alone: its entry is stale anyway).

    Each is judged on its task as it was before the call (a delivery made here names no entry
    yet), and a delivery named twice moves once, due at the first time given for it. A fixed
    number of statements per chunk of rows, whatever its size: a gate refusing a whole read
    batch costs a few round trips, not three per delivery.
    """
    by_id: dict[str, list[Deferral]] = {}
    for row in rows:
        by_id.setdefault(row.task_id, []).append(row)
    ids = sorted(by_id)
    moved = 0
    for lo in range(0, len(ids), _CHUNK):
        moved += _defer_chunk(conn, namespace, ids[lo : lo + _CHUNK], by_id, now)
    return moved


def _defer_chunk(
    conn: sa.Connection, namespace: str, ids: Sequence[str], by_id: dict[str, list[Deferral]], now: datetime
) -> int:
    """Lock the rows of ``ids`` in id order (the order the dispatcher's mark and every other
    multi-row write of dt_tasks lock in: no deadlock cycle), keep those still waiting on the
    refused delivery, then move them with one UPDATE and one INSERT."""
    found = conn.execute(
        sa.select(t.id, t.namespace, t.state, t.generation, t.delivery, t.queue, t.shadow)
        .where(t.id.in_(ids))
        .order_by(t.id)
        .with_for_update()
    ).all()
    chosen = []
    for r in found:
        if r.namespace != namespace or TaskState(r.state) not in _WAITING:
            continue
        refused = next((d for d in by_id[r.id] if (d.generation, d.delivery) == (r.generation, r.delivery)), None)
        if refused is not None:
            chosen.append((r, refused.due))
    if not chosen:
        return 0
    conn.execute(
        sa.update(tasks_table)
        .where(t.id.in_([r.id for r, _ in chosen]))
        .values(state=TaskState.PENDING, delivery=t.delivery + 1)
    )
    conn.execute(
        sa.insert(outbox_table),
        [
            outbox_row(namespace, r.id, r.queue, r.generation, r.delivery + 1, r.shadow, now, due=due)
            for r, due in chosen
        ],
    )
    return len(chosen)
