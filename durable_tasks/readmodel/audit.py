"""The audit log of operators' actions (retries, cancels, approvals), newest first."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..records import audit_table
from .paging import PAGE_SIZE, Page, utc

__all__ = ["audit_entries"]


def audit_entries(
    engine: sa.Engine, namespace: str, *, before: int | None = None, limit: int = PAGE_SIZE
) -> Page[dict[str, Any]]:
    """Operators' actions, newest first (ix_dt_audit_ns); the cursor is the last id shown."""
    c = audit_table.c
    where = [c.namespace == namespace] + ([c.id < before] if before else [])
    with engine.connect() as conn:
        rows = conn.execute(sa.select(audit_table).where(*where).order_by(c.id.desc()).limit(limit + 1)).all()
    items = [dict(r._mapping) | {"at": utc(r.at)} for r in rows[:limit]]
    return Page(items, str(items[-1]["id"]) if len(rows) > limit and items else None)
