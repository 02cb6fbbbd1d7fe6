"""The worker's SQL for attempts that are running: lease renewals, the heartbeat of a single
attempt, and the mark of an attempt that runs alone. Every write is fenced by the attempt's
(generation, attempt): a renewal that finds the row fenced out tells the worker so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa

from ..records import tasks_table
from .execution import ExecutionClaim, fenced_rows

__all__ = ["heartbeat", "mark_solo", "mark_started", "renew_leases"]

t = tasks_table.c


def renew_leases(conn: sa.Connection, claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> set[str]:
    """Extend the leases of many running attempts in one UPDATE … RETURNING; returns the task
    ids still held (the others have been fenced out)."""
    return set(
        conn.execute(
            sa.update(tasks_table).where(fenced_rows(claims)).values(lease_expires_at=now + lease).returning(t.id)
        ).scalars()
    )


def mark_solo(conn: sa.Connection, claim: ExecutionClaim, *, now: datetime) -> None:
    """Record that this attempt starts, alone: if its worker dies now, the loss is its own."""
    conn.execute(sa.update(tasks_table).where(claim.fence()).values(solo_attempt=claim.attempt, started_at=now))


def mark_started(conn: sa.Connection, claims: Sequence[ExecutionClaim], *, now: datetime) -> None:
    """Record that held attempts (claimed without a start: :attr:`ExecutionClaim.held`) start
    now: from here on, losing their worker makes them more suspect."""
    conn.execute(sa.update(tasks_table).where(fenced_rows(claims)).values(started_at=now))


def heartbeat(conn: sa.Connection, claim: ExecutionClaim, *, now: datetime, lease: timedelta) -> bool:
    """Extend the lease; False means this execution has been fenced out."""
    return bool(conn.execute(sa.update(tasks_table).where(claim.fence()).values(lease_expires_at=now + lease)).rowcount)
