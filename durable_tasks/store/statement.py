"""A hot path's PostgreSQL work as a value: one statement, its parameters, how to read its rows.

The dispatcher's lease and mark-SENT and the worker's batch claim and group commit are each
ONE statement that is its own transaction. The store builds them as :class:`OneStatement`
values and says nothing of how they are sent, so the same statement runs from a thread on a
pooled connection (:meth:`OneStatement.run`, for sync callers and tests), inside a larger
transaction (:meth:`OneStatement.run_on`), or on an event loop's own connection (:mod:`.aio`,
for the loops), without a sync and an async twin of each store function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from .engine import execute_alone

__all__ = ["OneStatement", "Rows"]

R = TypeVar("R")

#: What a statement returns, as plain tuples in the SELECT/RETURNING order.
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class OneStatement(Generic[R]):
    """One PostgreSQL statement run as its own transaction, and the reading of its rows."""

    sql: str
    params: Mapping[str, Any]
    read: Callable[[Rows], R]

    def run(self, engine: sa.Engine) -> R:
        """Run it on a pooled connection of ``engine`` (blocking: call from a thread)."""
        return self.read(execute_alone(engine, self.sql, self.params))

    def run_on(self, conn: sa.Connection) -> R:
        """Run it inside ``conn``'s transaction (a pass or group that needs more statements)."""
        return self.read([tuple(row) for row in conn.exec_driver_sql(self.sql, dict(self.params))])
