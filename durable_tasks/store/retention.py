"""Retention: delete what no recovery path needs any more, in bounded batches.

Sent or dead outbox rows and finished tasks (with their attempts) older than a cutoff go, a
batch per transaction so a large backlog never holds long locks. Tasks that are not final, a
task another transaction holds (a rerun in progress), and outbox rows still PENDING are never
touched.

A prune that starts its next batch the moment the last commits takes what the workers need.
Where writers are serialized (SQLite: one write lock per file) it keeps the lock from them: a
writer that found it taken sleeps in SQLite's busy handler (steps of 1 to 100 ms) and the
prune takes it again first. Elsewhere it takes CPU: old tasks with time-ordered ids lie
together, and an unpaced prune deletes them many times faster than workers finish new ones.
So the store gives a ``duty`` below 1: after each batch the prune waits so that its
transactions hold at most that share of the time (:func:`pause_after`). The pause never brings
the prune below ``min_rate`` tasks a second (the ``retention_min_rate`` setting): where the
database deletes slowly (MariaDB over ids spread across the whole key, each task's index
entries on pages of their own: docs/performance.md#a-paced-prune) a pace by share alone fell
far behind the intake it must keep up with, so there the prune takes more of the time, and at
worst runs unpaced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..records import TERMINAL_STATES, OutboxState, attempts_table, outbox_table, steps_table, tasks_table
from .payloads import delete_payloads
from .planning import by_task, names_task_indexes

__all__ = ["PruneReport", "delete_tasks", "final_tasks", "pause_after", "prune"]

t = tasks_table.c
o = outbox_table.c
a = attempts_table.c


@dataclass(slots=True)
class PruneReport:
    """What one prune removed."""

    outbox_rows: int = 0
    tasks: int = 0
    attempts: int = 0
    batches: int = 0
    #: The last batch was full: old rows may remain.
    more: bool = False
    #: What the last batch took, as the pace counts it: its tasks, or its settled outbox rows
    #: if those were more.
    last_rows: int = 0

    def add(self, other: PruneReport) -> None:
        """Count ``other``, a later prune's report, in this one."""
        self.outbox_rows += other.outbox_rows
        self.tasks += other.tasks
        self.attempts += other.attempts
        self.batches += other.batches
        self.more = other.more
        self.last_rows = other.last_rows


def final_tasks(namespace: str) -> sa.ColumnElement[bool]:
    """The tasks a prune may delete once they are old enough: final ones (their ``finished_at``
    says when)."""
    return sa.and_(t.namespace == namespace, t.state.in_(list(TERMINAL_STATES)))


def pause_after(held: float, duty: float, *, rows: int = 0, min_rate: float = 0.0) -> float:
    """Seconds to wait after a batch whose transaction took ``held`` seconds, so that batches
    hold the database ``duty`` (0 < duty <= 1) of the time: none at 1. With ``min_rate`` > 0,
    no longer than keeps a batch of ``rows`` at that many rows a second (none if the batch
    alone took longer)."""
    pause = held * (1.0 - duty) / duty
    if min_rate > 0.0:
        pause = min(pause, max(0.0, rows / min_rate - held))
    return pause


def delete_tasks(conn: sa.Connection, task_ids: Sequence[str]) -> tuple[int, int, int]:
    """Delete the tasks ``task_ids`` and what is theirs: attempts, journal, payload kept apart,
    outbox rows in any state. Returns the attempts, outbox rows and tasks deleted."""
    attempts = _delete_by_task(conn, attempts_table, a.outcome, task_ids)
    _delete_by_task(conn, steps_table, steps_table.c.kind, task_ids)
    delete_payloads(conn, task_ids)
    outbox_rows = _delete_by_task(conn, outbox_table, o.queue, task_ids)
    return attempts, outbox_rows, conn.execute(sa.delete(tasks_table).where(t.id.in_(task_ids))).rowcount


def _delete_by_task(conn: sa.Connection, table: sa.Table, unindexed: sa.Column[Any], task_ids: Sequence[str]) -> int:
    """Delete ``table``'s rows of ``task_ids`` through its index on task id whatever the
    statistics say (:mod:`.planning`): MariaDB estimated a batch's IN list from misleading
    statistics and planned the DELETE as a scan of the whole table. Where the index is named,
    a hinted SELECT (:func:`.planning.by_task`) finds the rows and the DELETE goes by primary key; the SELECT
    also reads ``unindexed``, a column the index lacks, as over the index alone MariaDB chose
    to scan all of it (``tests/integration/test_mysql_plans.py``)."""
    task_id, row_id = table.c.task_id, table.c.id
    if not names_task_indexes(conn.dialect.name):
        return conn.execute(sa.delete(table).where(task_id.in_(task_ids))).rowcount
    ids = [row.id for row in conn.execute(by_task(sa.select(row_id, unindexed), table).where(task_id.in_(task_ids)))]
    return conn.execute(sa.delete(table).where(row_id.in_(ids))).rowcount if ids else 0


def prune(
    engine: sa.Engine,
    namespace: str,
    *,
    before: datetime,
    batch: int,
    max_batches: int,
    duty: float = 1.0,
    min_rate: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> PruneReport:
    """Delete settled outbox rows and final tasks finished before ``before``, ``batch`` of each
    per transaction, at most ``max_batches`` transactions, pausing between them for ``duty``
    but never below ``min_rate`` tasks a second (:func:`pause_after`)."""
    report = PruneReport()
    while report.batches < max_batches:
        began = time.perf_counter()
        with engine.begin() as conn:
            outbox_ids = (
                conn.execute(
                    sa.select(o.id)
                    .where(
                        o.namespace == namespace,
                        o.state.in_([OutboxState.SENT, OutboxState.DEAD]),
                        sa.func.coalesce(o.sent_at, o.created_at) < before,
                    )
                    .limit(batch)
                )
                .scalars()
                .all()
            )
            if outbox_ids:
                report.outbox_rows += conn.execute(sa.delete(outbox_table).where(o.id.in_(outbox_ids))).rowcount
            # Locked, and a task another transaction holds is passed by: a rerun bringing it
            # back would lose it to this batch, its new outbox row left without a task.
            # (SQLite's writers take turns: no lock is rendered there.)
            old_tasks = sa.select(t.id).where(final_tasks(namespace), t.finished_at < before).limit(batch)
            task_ids = conn.execute(old_tasks.with_for_update(skip_locked=True)).scalars().all()
            if task_ids:
                attempts, outbox_rows, tasks = delete_tasks(conn, task_ids)
                report.attempts += attempts
                report.outbox_rows += outbox_rows
                report.tasks += tasks
        report.batches += 1
        report.more = len(outbox_ids) == batch or len(task_ids) == batch
        report.last_rows = max(len(outbox_ids), len(task_ids))
        if not report.more:
            break
        if duty < 1.0 and report.batches < max_batches:
            held = time.perf_counter() - began
            sleep(pause_after(held, duty, rows=report.last_rows, min_rate=min_rate))
    return report
