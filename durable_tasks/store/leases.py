"""The worker's SQL for attempts that are running: lease renewals, the heartbeat of a single
attempt, and the mark of an attempt that runs alone. Every write is fenced by the attempt's
(generation, attempt): a renewal that finds the row fenced out tells the worker so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa

from ..records import tasks_table
from . import sql
from .engine import is_postgres
from .execution import ExecutionClaim, fence_arrays, fenced_rows
from .statement import OneStatement, Rows

__all__ = ["heartbeat", "mark_solo", "renew_leases"]

t = tasks_table.c


def renew_leases(engine: sa.Engine, claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> set[str]:
    """Extend the leases of many running attempts in one statement; returns the task ids
    still held (the others have been fenced out)."""
    if not claims:
        return set()
    if is_postgres(engine):  # one statement, its own transaction, like the other hot statements
        params = {**fence_arrays(claims), "namespace": claims[0].namespace, "lease_until": now + lease}
        return OneStatement(sql.postgres()["renew_leases"], params, _task_ids).run(engine)
    with engine.begin() as conn:
        return set(
            conn.execute(
                sa.update(tasks_table).where(fenced_rows(claims)).values(lease_expires_at=now + lease).returning(t.id)
            ).scalars()
        )


def _task_ids(rows: Rows) -> set[str]:
    return {row[0] for row in rows}


def mark_solo(engine: sa.Engine, claim: ExecutionClaim) -> None:
    """Record that this attempt runs alone: if its worker dies now, the loss is its own."""
    with engine.begin() as conn:
        conn.execute(sa.update(tasks_table).where(claim.fence()).values(solo_attempt=claim.attempt))


def heartbeat(engine: sa.Engine, claim: ExecutionClaim, *, now: datetime, lease: timedelta) -> bool:
    """Extend the lease; False means this execution has been fenced out."""
    with engine.begin() as conn:
        updated = conn.execute(
            sa.update(tasks_table).where(claim.fence()).values(lease_expires_at=now + lease)
        ).rowcount
    return bool(updated)
