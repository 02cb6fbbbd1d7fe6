"""Agent runs as the dashboard shows them: the runs, newest first, and one run's turns with
the states of its tool-call tasks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ..records import metadata as runtime_metadata
from ..records import tasks_table
from ..store.planning import tasks_by_id
from .paging import PAGE_SIZE, Page, decode_cursor, encode_cursor, utc

__all__ = ["AgentRunDetail", "agent_run", "agent_runs"]

t = tasks_table.c


def _agent_tables() -> tuple[sa.Table, sa.Table] | None:
    """dt_agent_runs and dt_agent_turns (on the runtime's metadata, made by the migrations
    whether or not durable_tasks.agents is in use)."""
    tables = runtime_metadata.tables
    runs, turns = tables.get("dt_agent_runs"), tables.get("dt_agent_turns")
    return (runs, turns) if runs is not None and turns is not None else None


def agent_runs(
    engine: sa.Engine, namespace: str, *, cursor: str | None = None, limit: int = PAGE_SIZE
) -> Page[dict[str, Any]]:
    """Agent runs, newest first, one page after ``cursor``; empty when agents are not in use."""
    found = _agent_tables()
    if found is None:
        return Page([], None)
    runs = found[0].c
    where = [runs.namespace == namespace]
    if cursor:
        at, key = decode_cursor(cursor)
        where.append(
            sa.tuple_(runs.created_at, runs.id) < sa.tuple_(sa.literal(at, runs.created_at.type), sa.literal(key))
        )
    columns = (runs.id, runs.agent, runs.state, runs.generation, runs.created_at, runs.finished_at)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(*columns).where(*where).order_by(runs.created_at.desc(), runs.id.desc()).limit(limit + 1)
        ).all()
    items = [dict(r._mapping) | {"created_at": utc(r.created_at)} for r in rows[:limit]]
    more = len(rows) > limit and items
    return Page(items, encode_cursor(items[-1]["created_at"], items[-1]["id"]) if more else None)


@dataclass(frozen=True, slots=True)
class AgentRunDetail:
    """A run, its turns (every generation, in order) and the states of its tool-call tasks."""

    run: dict[str, Any]
    turns: list[dict[str, Any]]
    task_states: dict[str, dict[str, Any]] = field(default_factory=dict)


def agent_run(engine: sa.Engine, namespace: str, run_id: str) -> AgentRunDetail | None:
    """One run with its turns and tool-call task states, or None."""
    found = _agent_tables()
    if found is None:
        return None
    runs, turns = found
    with engine.connect() as conn:
        run = conn.execute(sa.select(runs).where(runs.c.namespace == namespace, runs.c.id == run_id)).one_or_none()
        if run is None:
            return None
        turn_rows = conn.execute(
            sa.select(turns).where(turns.c.run_id == run_id).order_by(turns.c.generation, turns.c.index)
        ).all()
        detail = AgentRunDetail(dict(run._mapping), [dict(r._mapping) for r in turn_rows])
        task_ids = _call_task_ids(detail.turns)
        if task_ids:
            for r in conn.execute(
                sa.select(t.id, t.name, t.state, t.attempt, t.error_type, t.error_message).where(
                    tasks_by_id(namespace, task_ids)
                )
            ):
                detail.task_states[r.id] = dict(r._mapping)
    return detail


def _call_task_ids(turns: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for turn in turns:
        try:
            calls = json.loads(turn.get("calls") or "[]")
        except ValueError:
            continue
        ids += [str(c["task_id"]) for c in calls if isinstance(c, dict) and c.get("task_id")]
    return ids
