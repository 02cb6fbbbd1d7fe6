"""Which tasks the indexes of ``dt_tasks`` that name ``state`` hold, and how a query reads them.

Most of a queue's tasks are its history: they succeeded, and wait for ``prune``. On PostgreSQL
``ix_dt_tasks_state`` leaves them out (``state <> 'SUCCEEDED'``): it holds the tasks an operator
counts (waiting, sent, running, retrying, suspended, failed, dead, cancelled), not one entry per
task ever run, and a task's result, the update that makes it SUCCEEDED, writes no entry to it (a
task's dispatch, claim and result each change its ``state``, and none of those updates is HOT, so
each writes an entry into every index whose predicate the new row meets). The reconciler walks
the sent tasks (:data:`SENT`) on ``ix_dt_tasks_sent``. MySQL/MariaDB (which has no partial
index) and SQLite keep ``ix_dt_tasks_state`` over every state: SQLite plans without statistics,
and the embedded default's plans (:mod:`.store.planning`) were measured with that index.
Operators' views find the tasks that succeeded by ``finished_at`` (``ix_dt_tasks_finished``).

A query reads a partial index only if its WHERE implies the predicate; with the states as bound
parameters, a generic plan (psycopg prepares a statement that runs often) cannot tell that it
does. :func:`indexed_by_state` and :func:`sent_tasks` repeat the predicates in constants.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

__all__ = [
    "SENT",
    "STATE_INDEX_LEAVES_OUT",
    "indexed_by_state",
    "predicate",
    "sent_tasks",
    "state_index",
    "state_predicate",
]

#: ix_dt_tasks_sent's tasks: their delivery is in a Redis stream (the reconciler walks them).
SENT = ("ENQUEUED", "RUNNING")
#: The one state ix_dt_tasks_state does not hold on PostgreSQL.
STATE_INDEX_LEAVES_OUT = "SUCCEEDED"


def predicate(states: Iterable[str], column: str = "state") -> str:
    """``state = 'A' OR state = 'B'``: ix_dt_tasks_sent's predicate, or a query's copy of it."""
    return " OR ".join(f"{column} = '{state}'" for state in states)


def state_predicate(column: str = "state") -> str:
    """ix_dt_tasks_state's predicate on PostgreSQL, or a query's copy of it."""
    return f"{column} <> '{STATE_INDEX_LEAVES_OUT}'"


def sent_tasks() -> sa.TextClause:
    """ix_dt_tasks_sent's predicate, in constants, for a query of ``dt_tasks`` to repeat."""
    return sa.text(f"({predicate(SENT, 'dt_tasks.state')})")


def state_index() -> sa.TextClause:
    """ix_dt_tasks_state's predicate, in constants, for a query of ``dt_tasks`` to repeat."""
    return sa.text(f"({state_predicate('dt_tasks.state')})")


def indexed_by_state(state: str) -> list[sa.TextClause]:
    """What a query of the tasks in ``state`` repeats to read ix_dt_tasks_state, as terms for its
    WHERE (none: that index does not hold them)."""
    return [] if state == STATE_INDEX_LEAVES_OUT else [state_index()]
