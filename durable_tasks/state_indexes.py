"""Which tasks the partial indexes of ``dt_tasks`` that name ``state`` hold, and how a query
reads them.

A task's dispatch, claim and result each change its ``state``, so each writes a new entry into
every index of ``dt_tasks`` whose predicate the new row meets. An index of every state took an
entry at all three and at the insert; on PostgreSQL ``ix_dt_tasks_state`` therefore holds only
the states a task rests in off that path (:data:`OFF_PATH`: not yet sent, between attempts,
suspended, or ended other than by success), one entry for a task that succeeds at its first
attempt, and the sent tasks are ``ix_dt_tasks_sent``'s (:data:`SENT`). SQLite (which reads a
partial index only for a query that repeats its predicate's terms) and MySQL/MariaDB (which has
none) keep ``ix_dt_tasks_state`` over every state. The tasks that succeeded are in no index by
state: operators' views find them by ``finished_at`` (``ix_dt_tasks_finished``).

A query reads a partial index only if its WHERE implies the predicate; with the states as bound
parameters, a generic plan (psycopg prepares a statement that runs often) cannot tell that it
does. :func:`indexed_by_state` repeats the predicate in constants.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

__all__ = ["OFF_PATH", "SENT", "indexed_by_state", "predicate", "sent_tasks"]

#: ix_dt_tasks_sent's tasks: their delivery is in a Redis stream (the reconciler walks them).
SENT = ("ENQUEUED", "RUNNING")
#: ix_dt_tasks_state's tasks on PostgreSQL.
OFF_PATH = ("PENDING", "RETRYING", "WAITING", "FAILED", "DEAD", "CANCELLED")


def predicate(states: Iterable[str], column: str = "state") -> str:
    """``state = 'A' OR state = 'B'``: a partial index's predicate, or a query's copy of it."""
    return " OR ".join(f"{column} = '{state}'" for state in states)


def _repeated(states: tuple[str, ...]) -> sa.TextClause:
    return sa.text(f"({predicate(states, 'dt_tasks.state')})")


def sent_tasks() -> sa.TextClause:
    """ix_dt_tasks_sent's predicate, in constants, for a query of ``dt_tasks`` to repeat."""
    return _repeated(SENT)


def indexed_by_state(state: str) -> sa.TextClause | None:
    """The predicate, in constants, of the partial index that holds the tasks in ``state``, for
    a query of ``dt_tasks`` to repeat beside its own test of the state (None: no index by state
    holds them)."""
    for states in (SENT, OFF_PATH):
        if state in states:
            return _repeated(states)
    return None
