"""The SQL of periodic schedules (``dt_schedules``): declare, read, advance, pause.

Portable SQLAlchemy Core, the same on every dialect: a scheduler runs a few statements per
tick, not per task. A tick is handed out by a compare-and-set on ``last_tick_at`` (and
``paused``): of several schedulers that planned the same tick, the first UPDATE wins and
the others match no row (on PostgreSQL and MySQL they wait for the winner's commit and
re-read the row; SQLite serializes writers), so one of them submits it; the tick's
idempotency key makes a second submit impossible anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..records import schedules_table

__all__ = ["DeclaredSchedule", "ScheduleState", "advance", "declare", "load", "set_paused"]

s = schedules_table.c


@dataclass(frozen=True, slots=True)
class DeclaredSchedule:
    """What the application's code says about one schedule."""

    name: str
    task_name: str
    spec: str
    catch_up: str
    next_tick_at: datetime | None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """One ``dt_schedules`` row (times aware UTC)."""

    name: str
    task_name: str
    spec: str
    catch_up: str
    paused: bool
    last_tick_at: datetime
    next_tick_at: datetime | None
    updated_at: datetime


def load(engine: sa.Engine, namespace: str) -> dict[str, ScheduleState]:
    """Every schedule row of ``namespace``, by name."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                s.name, s.task_name, s.spec, s.catch_up, s.paused, s.last_tick_at, s.next_tick_at, s.updated_at
            ).where(s.namespace == namespace)
        ).all()
    return {
        r.name: ScheduleState(
            r.name,
            r.task_name,
            r.spec,
            r.catch_up,
            bool(r.paused),
            _aware(r.last_tick_at),
            _aware_or_none(r.next_tick_at),
            _aware(r.updated_at),
        )
        for r in rows
    }


def declare(engine: sa.Engine, namespace: str, declared: Sequence[DeclaredSchedule], now: datetime) -> None:
    """Insert the rows of new schedules (their first tick is the first one after ``now``) and
    bring the declared fields of existing ones up to date; paused flags and ticks are kept."""
    now = now.replace(microsecond=0)  # ticks are whole seconds; MySQL's DATETIME keeps no more
    existing = load(engine, namespace)
    for d in declared:
        found = existing.get(d.name)
        if found is None:
            _insert(engine, namespace, d, now)
        elif (found.task_name, found.spec, found.catch_up) != (d.task_name, d.spec, d.catch_up):
            with engine.begin() as conn:
                conn.execute(
                    sa.update(schedules_table)
                    .where(s.namespace == namespace, s.name == d.name)
                    .values(
                        task_name=d.task_name,
                        spec=d.spec,
                        catch_up=d.catch_up,
                        next_tick_at=d.next_tick_at,
                        updated_at=now,
                    )
                )


def _insert(engine: sa.Engine, namespace: str, d: DeclaredSchedule, now: datetime) -> None:
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(schedules_table).values(
                    namespace=namespace,
                    name=d.name,
                    task_name=d.task_name,
                    spec=d.spec,
                    catch_up=d.catch_up,
                    paused=False,
                    last_tick_at=now,
                    next_tick_at=d.next_tick_at,
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError:
        pass  # another scheduler declared it first: its row is as good as ours


def advance(
    conn: sa.Connection,
    namespace: str,
    name: str,
    *,
    seen: ScheduleState,
    last_tick: datetime,
    next_tick: datetime | None,
    now: datetime,
) -> bool:
    """Move the schedule from the state ``seen`` to ``last_tick``, in the caller's transaction;
    False (nothing written) when another scheduler or an operator changed it meanwhile."""
    moved = conn.execute(
        sa.update(schedules_table)
        .where(
            s.namespace == namespace,
            s.name == name,
            s.last_tick_at == seen.last_tick_at,
            s.paused == seen.paused,
        )
        .values(last_tick_at=last_tick, next_tick_at=next_tick, updated_at=now)
    ).rowcount
    return bool(moved)


def set_paused(
    engine: sa.Engine, namespace: str, name: str, *, paused: bool, now: datetime, next_tick: datetime | None
) -> bool:
    """Pause or resume a schedule; False if there is no such row. Resuming moves the last tick
    to ``now`` (when it is behind), so the ticks that fell while it was paused are skipped
    rather than caught up."""
    now = now.replace(microsecond=0)
    values: dict[str, object] = {"paused": paused, "updated_at": now, "next_tick_at": next_tick}
    with engine.begin() as conn:
        if not paused:
            values["last_tick_at"] = sa.case((s.last_tick_at < now, now), else_=s.last_tick_at)
        changed = conn.execute(
            sa.update(schedules_table).where(s.namespace == namespace, s.name == name).values(values)
        ).rowcount
    return bool(changed)


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _aware_or_none(moment: datetime | None) -> datetime | None:
    return None if moment is None else _aware(moment)
