"""What the portable statements tell the query planners.

A batch statement finds its rows by primary key (``id IN (...)``) and then tests namespace and
state on them. SQLite plans without statistics (the embedded default never runs ``ANALYZE``)
and guesses that an equality on an index's first column narrows to about ten rows; against a
list of hundreds of ids it then prefers ``ix_dt_tasks_created (namespace, ...)`` or
``ix_dt_tasks_state (namespace, state, queue)`` and reads every task of the namespace, finished
ones included: a claim of 256 tasks took 57 ms over 300,000 finished rows and the drain fell to
a tenth over 1,000,000 (``python -m benchmarks.bench_scale --cases history`` on SQLite).
:func:`tasks_by_id` is that lookup for every statement that reads or writes tasks by a list
of ids; :func:`filter_only` marks a (text) column as a filter, never an index to search by:
SQLite's unary ``+`` (a no-op on any value) takes a term out of index selection, and so does
PostgreSQL's ``|| ''``. PostgreSQL's hot statements are its own SQL, which tests these columns
after locking the rows by key; its Core statements are the single-row writes of an execution
(its fence: a recorded step, a suspension, a failure, a result with an on-commit hook). With
statistics taken while few tasks ran, ``state = 'RUNNING'`` in such a fence was planned as a
search of ``ix_dt_tasks_sent`` (the namespace's every sent task, whose partial predicate the
state implies) instead of the primary key. On MySQL the column is as it is (MariaDB, which
keeps statistics, drained as fast with 1,000,000 finished tasks as with none).

MariaDB's statistics mislead it the other way on ``dt_attempts``, a table that grows by every
claim: an UPDATE of the attempts of 512 tasks, found by ``ix_dt_attempts_task``, was planned as
a full scan of the primary key while the table held tens of thousands of rows, and ran that way
(100,000+ rows examined per statement, seen with ``SHOW EXPLAIN FOR`` on the worker's
connection) until a statistics refresh flipped it: the drain of a 1,000,000-task backlog fell
to half its pace as the table grew. :func:`attempts_by_task` names the index on MySQL and
MariaDB (``FORCE INDEX``); the other dialects get the statement as it is. :func:`by_task`
does the same for ``dt_outbox`` and ``dt_steps`` (a prune's lookup of a batch's outbox rows
and journal steps), which grow by every submit and recorded step.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.visitors import InternalTraversal

from ..records import attempts_table, outbox_table, steps_table, tasks_table

__all__ = ["attempts_by_task", "by_task", "filter_only", "names_task_indexes", "tasks_by_id"]

#: The tables found by task id through an index named on MySQL and MariaDB, and that index
#: (the hint is rendered by SQLAlchemy on those dialects only, after the table's name).
_TASK_INDEX = {
    attempts_table.name: "ix_dt_attempts_task",
    outbox_table.name: "ix_dt_outbox_task_id",
    steps_table.name: "uq_dt_steps_slot",
}
_HINTED = ("mysql", "mariadb")

_Statement = TypeVar("_Statement", sa.Update, sa.Select[Any])


class _FilterOnly(sa.ColumnElement[Any]):
    """A column tested by a statement, not one to find its rows by."""

    inherit_cache = True
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement)]  # noqa: RUF012 - SQLAlchemy's name

    def __init__(self, column: sa.ColumnElement[Any]) -> None:
        self.column = column
        self.type = column.type


@compiles(_FilterOnly)
def _as_is(element: _FilterOnly, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column, **kw)


@compiles(_FilterOnly, "sqlite")
def _unary_plus(element: _FilterOnly, compiler: SQLCompiler, **kw: Any) -> str:
    return "+" + compiler.process(element.column, **kw)


@compiles(_FilterOnly, "postgresql")
def _concatenated(element: _FilterOnly, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({compiler.process(element.column, **kw)} || '')"


def filter_only(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``column`` for a WHERE that must not pick an index by it (see the module's doc)."""
    return _FilterOnly(column)


def tasks_by_id(
    namespace: str | sa.BindParameter[str], ids: Collection[str] | sa.BindParameter[Any]
) -> sa.ColumnElement[bool]:
    """The ``dt_tasks`` rows of ``ids`` in ``namespace``: found by primary key, the namespace
    tested on them. Every lookup of tasks by a list of ids goes through here (values, or bind
    parameters for a statement built once)."""
    t = tasks_table.c
    return sa.and_(t.id.in_(ids), filter_only(t.namespace) == namespace)


def by_task(statement: _Statement, table: sa.Table) -> _Statement:
    """``statement`` on ``table`` (``dt_attempts``, ``dt_outbox`` or ``dt_steps``, which grow by
    every claim, submit and recorded step), found by its index on task id on MySQL and MariaDB
    whatever their statistics say (see the module's doc)."""
    hint = f"FORCE INDEX ({_TASK_INDEX[table.name]})"
    for dialect in _HINTED:
        if isinstance(statement, sa.Select):
            statement = statement.with_hint(table, hint, dialect_name=dialect)
        else:
            statement = statement.with_hint(hint, dialect_name=dialect)
    return statement


def attempts_by_task(statement: _Statement) -> _Statement:
    """``statement`` on ``dt_attempts``, found by ``ix_dt_attempts_task`` (:func:`by_task`)."""
    return by_task(statement, attempts_table)


def names_task_indexes(dialect_name: str) -> bool:
    """Whether :func:`by_task` names the index on this dialect. A statement that cannot carry
    the hint (MySQL's single-table ``DELETE`` takes none) finds its rows with a hinted
    ``SELECT`` there, and writes them by primary key."""
    return dialect_name in _HINTED
