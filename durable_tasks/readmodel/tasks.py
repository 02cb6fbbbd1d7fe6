"""Tasks as an operator's view lists them: the keyed search, a task's detail, the overview's
capped counts and the feed of finished tasks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ..errors import InvalidQueryError
from ..records import TaskState, tasks_table
from ..state_indexes import indexed_by_state
from ..store.queries import task_rows
from ..store.retention import final_tasks
from .paging import COUNT_CAP, MAX_NAMES, PAGE_SIZE, Page, decode_cursor, encode_cursor, utc

__all__ = [
    "FinishedRow",
    "TaskDetail",
    "TaskFilter",
    "TaskRow",
    "finished_after",
    "list_finished",
    "list_tasks",
    "oldest_final",
    "state_counts",
    "task_detail",
    "task_names",
]

t = tasks_table.c


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """What a task search asks for; every field is optional and they combine with AND."""

    task_id: str | None = None
    idempotency_key: str | None = None
    name: str | None = None
    state: str | None = None
    queue: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in TaskState.__members__:
            raise InvalidQueryError(f"unknown state {self.state!r}; one of {', '.join(TaskState)}")


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task as a list shows it (never its payload or result)."""

    id: str
    name: str
    queue: str
    state: str
    generation: int
    attempt: int
    idempotency_key: str | None
    created_at: datetime
    finished_at: datetime | None
    error_type: str | None
    error_message: str | None

    @classmethod
    def from_row(cls, row: sa.RowMapping) -> TaskRow:
        """From a row of :data:`_ROW_COLUMNS`."""
        return cls(
            row["id"],
            row["name"],
            row["queue"],
            row["state"],
            row["generation"],
            row["attempt"],
            row["idempotency_key"],
            utc(row["created_at"]) or datetime.min.replace(tzinfo=UTC),
            utc(row["finished_at"]),
            row["error_type"],
            row["error_message"],
        )


_ROW_COLUMNS = (
    t.id,
    t.name,
    t.queue,
    t.state,
    t.generation,
    t.attempt,
    t.idempotency_key,
    t.created_at,
    t.finished_at,
    t.error_type,
    t.error_message,
)


def _conditions(conn: sa.Connection, namespace: str, flt: TaskFilter) -> list[sa.ColumnElement[bool]]:
    where: list[sa.ColumnElement[bool]] = [t.namespace == namespace]
    if flt.task_id:
        where.append(t.id == flt.task_id)
    if flt.idempotency_key:
        where.append(t.idempotency_key == flt.idempotency_key)
        # (namespace, name, idempotency_key) is the only index on the key: name every name
        if not flt.name:
            where.append(t.name.in_(_names(conn, namespace)))
    for column, value in ((t.name, flt.name), (t.state, flt.state), (t.queue, flt.queue)):
        if value:
            where.append(column == value)
    if flt.since:
        where.append(t.created_at >= flt.since)
    if flt.until:
        where.append(t.created_at < flt.until)
    return where


def list_tasks(
    engine: sa.Engine, namespace: str, flt: TaskFilter, *, cursor: str | None = None, limit: int = PAGE_SIZE
) -> Page[TaskRow]:
    """Tasks matching ``flt``, newest first (ix_dt_tasks_created), one page after ``cursor``."""
    with engine.connect() as conn:
        where = _conditions(conn, namespace, flt)
        if cursor:
            at, key = decode_cursor(cursor)
            where.append(sa.tuple_(t.created_at, t.id) < sa.tuple_(sa.literal(at, t.created_at.type), sa.literal(key)))
        rows = conn.execute(
            sa.select(*_ROW_COLUMNS).where(*where).order_by(t.created_at.desc(), t.id.desc()).limit(limit + 1)
        ).all()
    items = [TaskRow.from_row(r._mapping) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(items, encode_cursor(items[-1].created_at, items[-1].id) if more and items else None)


def list_finished(
    engine: sa.Engine,
    namespace: str,
    states: Sequence[str],
    *,
    queue: str | None = None,
    name: str | None = None,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
) -> Page[TaskRow]:
    """Finished tasks in ``states`` (e.g. FAILED and DEAD), most recently finished first
    (ix_dt_tasks_finished), one page after ``cursor``."""
    where = [t.namespace == namespace, t.finished_at.is_not(None), t.state.in_(list(states))]
    where += [c == v for c, v in ((t.queue, queue), (t.name, name)) if v]
    if cursor:
        at, key = decode_cursor(cursor)
        where.append(sa.tuple_(t.finished_at, t.id) < sa.tuple_(sa.literal(at, t.finished_at.type), sa.literal(key)))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(*_ROW_COLUMNS).where(*where).order_by(t.finished_at.desc(), t.id.desc()).limit(limit + 1)
        ).all()
    items = [TaskRow.from_row(r._mapping) for r in rows[:limit]]
    last = items[-1] if items else None
    more = len(rows) > limit and last is not None and last.finished_at is not None
    return Page(items, encode_cursor(last.finished_at, last.id) if more and last and last.finished_at else None)


def _names(conn: sa.Connection, namespace: str) -> list[str]:
    """Distinct task names by a loose index scan of uq_dt_tasks_idem: one index probe per
    name, however many tasks each has (a plain DISTINCT would read every row)."""
    rows = conn.execute(
        sa.text(
            "WITH RECURSIVE n(name) AS ("
            " SELECT min(name) FROM dt_tasks WHERE namespace = :ns"
            " UNION ALL"
            " SELECT (SELECT min(name) FROM dt_tasks WHERE namespace = :ns AND name > n.name)"
            " FROM n WHERE n.name IS NOT NULL"
            ") SELECT name FROM n WHERE name IS NOT NULL LIMIT :cap"
        ),
        {"ns": namespace, "cap": MAX_NAMES},
    )
    return [str(r[0]) for r in rows]


def task_names(engine: sa.Engine, namespace: str) -> list[str]:
    """Every task name that has a row (up to ``MAX_NAMES``), sorted."""
    with engine.connect() as conn:
        return _names(conn, namespace)


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """A task's row and its attempts (all generations, oldest first), as stored: columns
    added by later versions (a traceback) appear without a change here."""

    task: dict[str, Any]
    attempts: list[dict[str, Any]]

    @property
    def trace_id(self) -> str | None:
        """The trace id of the stored W3C traceparent (``00-<trace id>-<span id>-<flags>``)."""
        parts = str(self.task.get("traceparent") or "").split("-")
        return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def task_detail(engine: sa.Engine, namespace: str, task_id: str) -> TaskDetail | None:
    """The task and its attempts, or None if there is no such task."""
    with engine.connect() as conn:
        rows = task_rows(conn, namespace, task_id)
    if rows is None:
        return None
    row, attempts = rows
    return TaskDetail(dict(row._mapping), [dict(r._mapping) for r in attempts])


# -- the overview ------------------------------------------------------------------------


def state_counts(
    engine: sa.Engine, namespace: str, queues: Sequence[str], states: Sequence[str], *, cap: int = COUNT_CAP
) -> dict[tuple[str, str], int]:
    """Tasks per (queue, state), each count stopping at ``cap + 1`` (ix_dt_tasks_state: an
    index range per pair, read at most ``cap + 1`` entries deep). On PostgreSQL that index leaves
    out SUCCEEDED (durable_tasks.state_indexes): a count of them reads the namespace's tasks
    until ``cap + 1`` match (no view counts them)."""
    if not queues or not states:
        return {}
    parts = []
    for queue in queues:
        for state in states:
            capped = (
                sa.select(sa.literal(1).label("one"))
                .where(t.namespace == namespace, t.state == state, t.queue == queue, *indexed_by_state(state))
                .limit(cap + 1)
                .subquery()
            )
            parts.append(
                sa.select(
                    sa.literal(queue).label("queue"), sa.literal(state).label("state"), sa.func.count().label("n")
                ).select_from(capped)
            )
    with engine.connect() as conn:
        rows = conn.execute(sa.union_all(*parts)).all()
    return {(r.queue, r.state): int(r.n) for r in rows}


@dataclass(frozen=True, slots=True)
class FinishedRow:
    """A task that reached a final state: when, where, how, and how long since its submit."""

    id: str
    queue: str
    state: str
    created_at: datetime
    finished_at: datetime


def finished_after(
    engine: sa.Engine,
    namespace: str,
    after: tuple[datetime, str] | None,
    *,
    until: datetime,
    limit: int = 5_000,
) -> list[FinishedRow]:
    """Tasks finished after the (finished_at, id) key ``after`` and no later than ``until``,
    oldest first (ix_dt_tasks_finished): a reader keeps the last key and asks for what is new."""
    where = [t.namespace == namespace, t.finished_at.is_not(None), t.finished_at <= until]
    if after is not None:
        at, key = after
        where.append(sa.tuple_(t.finished_at, t.id) > sa.tuple_(sa.literal(at, t.finished_at.type), sa.literal(key)))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.id, t.queue, t.state, t.created_at, t.finished_at)
            .where(*where)
            .order_by(t.finished_at, t.id)
            .limit(limit)
        ).all()
    return [FinishedRow(r.id, r.queue, r.state, utc(r.created_at), utc(r.finished_at)) for r in rows]  # type: ignore[arg-type]


def oldest_final(engine: sa.Engine, namespace: str) -> datetime | None:
    """When the oldest final task finished (None: there is none): the first task a prune
    deletes, found as the prune finds it (:func:`~..store.retention.final_tasks`, by
    ``finished_at``: ix_dt_tasks_finished)."""
    with engine.connect() as conn:
        at = conn.execute(
            sa.select(t.finished_at)
            .where(final_tasks(namespace), t.finished_at.is_not(None))
            .order_by(t.finished_at)
            .limit(1)
        ).scalar()
    return utc(at)
