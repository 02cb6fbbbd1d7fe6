"""SQLModel tables: the durable intent (``dt_tasks``, large payloads in ``dt_payloads``), delivery
intents (``dt_outbox``), the audit trail of executions (``dt_attempts``) and of operators'
actions (``dt_audit``), the step journal (``dt_steps``), periodic schedules (``dt_schedules``)
and the agent records (``dt_agent_runs``, ``dt_agent_turns``).

Every row carries its App's namespace. Timestamps are aware UTC (timestamptz on Postgres,
DATETIME(6) in UTC on MySQL/MariaDB). On MySQL/MariaDB ids, names, keys and journal slots compare
as bytes (``'CaseKey'`` is not ``'casekey'``), and namespaces and queue names are ASCII, which keeps
the idempotency key's unique index within InnoDB's 3,072 bytes. Payloads and results are the exact
JSON text the runtime validated: nothing is serialized twice.

The tables live on their own :data:`metadata`, not on SQLModel's global one: an application's
``SQLModel.metadata.create_all()`` or Alembic autogenerate does not see them. Their schema is
made and changed by the numbered migrations of :mod:`durable_tasks.migrations`
(``durable-tasks migrate``, ``App.create_all()``); a column added here needs a migration step,
and ``tests/integration/test_migrations_match_models.py`` fails until it has one.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel
from sqlmodel.sql.sqltypes import UTCDateTime

from .state_indexes import SENT, predicate, state_predicate

__all__ = [
    "AgentRun",
    "AgentTurn",
    "AttemptOutcome",
    "AttemptRecord",
    "AuditRecord",
    "JsonText",
    "OutboxRecord",
    "OutboxState",
    "PayloadRecord",
    "RuntimeRecord",
    "ScheduleRecord",
    "StepRecord",
    "TaskRecord",
    "TaskState",
    "Timestamp",
    "metadata",
]

#: The runtime's tables, and only those.
metadata = sa.MetaData()


class RuntimeRecord(SQLModel, registry=registry(metadata=metadata)):
    """Base of the runtime's tables: they register on :data:`metadata`."""


_MYSQL = ("mysql", "mariadb")

#: The JSON users hand over and get back (payloads, results, journal steps, agent records): TEXT,
#: up to 1 GB on PostgreSQL and SQLite; MEDIUMTEXT (16 MiB) on MySQL/MariaDB, whose TEXT holds
#: 65,535 bytes, less than a payload may have (``max_payload_bytes``).
JsonText = sa.Text().with_variant(mysql.MEDIUMTEXT(), *_MYSQL)


def _key(length: int) -> sa.types.TypeEngine[str]:
    """Text compared byte for byte (MySQL's default collations ignore case)."""
    return sa.String(length).with_variant(mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), *_MYSQL)


def _ascii(length: int) -> sa.types.TypeEngine[str]:
    """Names restricted to ASCII (namespaces, queues): one byte a character in a MySQL index."""
    return sa.String(length).with_variant(mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"), *_MYSQL)


class Timestamp(UTCDateTime):
    """An aware UTC timestamp; microseconds kept on MySQL/MariaDB too (DATETIME(6))."""

    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[datetime]:
        return _DATETIME.dialect_impl(dialect)


_DATETIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *_MYSQL)


def _at() -> Any:
    """A required timestamp column."""
    return Field(sa_type=Timestamp)


def _maybe_at() -> Any:
    """A timestamp column that may be NULL."""
    return Field(default=None, sa_type=Timestamp)


#: Half-empty pages on PostgreSQL: an outbox row's lease and an attempt's close, updates of no
#: indexed column, then fit on the row's page, heap-only tuples with no index entry (migration 19).
_HOT_UPDATES = {"postgresql_with": {"fillfactor": 50}}
_NOT_DONE = sa.text("NOT done")  # dt_steps' open waits


class TaskState(StrEnum):
    """Lifecycle of a task: PENDING → ENQUEUED → RUNNING → a terminal state."""

    PENDING = "PENDING"
    ENQUEUED = "ENQUEUED"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    WAITING = "WAITING"  # suspended on its children or a signal: no worker slot, no lease
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED})
CLAIMABLE_STATES = (TaskState.PENDING, TaskState.ENQUEUED, TaskState.RETRYING)


class OutboxState(StrEnum):
    """Lifecycle of one delivery intent."""

    PENDING = "PENDING"
    SENT = "SENT"
    DEAD = "DEAD"


class AttemptOutcome(StrEnum):
    """How one execution attempt ended (None while it runs)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    FENCED_OUT = "fenced_out"
    LOST = "lost"
    SUSPENDED = "suspended"  # the handler waits for children or a signal (see durable_tasks.journal)
    HOOK_FAILED = "hook_failed"  # the body succeeded, its on_commit hook raised: nothing was committed


_SENT, _UNSUCCEEDED = predicate(SENT), state_predicate()  # see durable_tasks.state_indexes


class TaskRecord(RuntimeRecord, table=True):
    """``dt_tasks``: one row per logical task, its current generation and its outcome."""

    __tablename__ = "dt_tasks"
    __table_args__ = (
        sa.UniqueConstraint("namespace", "name", "idempotency_key", name="uq_dt_tasks_idem"),
        sa.Index("ix_dt_tasks_state", "namespace", "state", "queue", postgresql_where=sa.text(_UNSUCCEEDED)),
        # Operators' views (durable_tasks.readmodel): the task search, newest first, and what
        # finished lately (throughput, latency, failures). The second holds finished rows
        # only, so a task's claim and lease updates never write to it: one entry per task.
        sa.Index("ix_dt_tasks_created", "namespace", "created_at", "id"),
        sa.Index(
            "ix_dt_tasks_finished",
            "namespace",
            "finished_at",
            "id",
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            sqlite_where=sa.text("finished_at IS NOT NULL"),
        ),
        # The reconciler's walk over the sent tasks, in (enqueued_at, id) order from its cursor
        # (store/recovery.py). MySQL has no partial index: the two states are two ranges of the second.
        sa.Index(
            "ix_dt_tasks_sent",
            "namespace",
            "enqueued_at",
            "id",
            postgresql_where=sa.text(_SENT),
            sqlite_where=sa.text(_SENT),
        ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # SQLAlchemy takes a tuple
        sa.Index("ix_dt_tasks_sent", "namespace", "state", "enqueued_at", "id").ddl_if(
            dialect=_MYSQL  # type: ignore[arg-type]
        ),
    )

    id: str = Field(primary_key=True, max_length=36, sa_type=_key(36))
    namespace: str = Field(max_length=64, sa_type=_ascii(64))
    name: str = Field(max_length=200, sa_type=_key(200))
    queue: str = Field(max_length=64, sa_type=_ascii(64))
    idempotency_key: str | None = Field(default=None, max_length=512, sa_type=_key(512))
    payload: str = Field(sa_type=JsonText)  # '' when kept in dt_payloads
    payload_bytes: int | None = None  # in UTF-8 (NULL: older code, dt_submit): store/payloads.py
    state: str = Field(default=TaskState.PENDING, max_length=16)
    generation: int = 0
    attempt: int = 0
    delivery: int = 0
    reclaims: int = 0
    counted_losses: int = 0
    solo_attempt: int | None = None
    failures: int = 0
    max_attempts: int = 1
    lease_expires_at: datetime | None = _maybe_at()
    worker_id: str | None = Field(default=None, max_length=200)
    result: str | None = Field(default=None, sa_type=JsonText)
    error_type: str | None = Field(default=None, max_length=200)
    error_message: str | None = Field(default=None, sa_type=sa.Text)
    traceparent: str | None = Field(default=None, max_length=128)
    partition_key: str | None = Field(default=None, max_length=200, sa_type=_key(200))
    #: Flow control (durable_tasks.flow): the priority level (NULL: 0) and the concurrency key.
    priority: int | None = None
    concurrency_key: str | None = Field(default=None, max_length=200, sa_type=_key(200))
    shadow: bool = False
    #: A child task's parent: the task, generation and journal slot its outcome settles.
    parent_id: str | None = Field(default=None, max_length=36, sa_type=_key(36))
    parent_generation: int | None = None
    parent_slot: str | None = Field(default=None, max_length=200, sa_type=_key(200))
    created_at: datetime = _at()
    enqueued_at: datetime | None = _maybe_at()
    started_at: datetime | None = _maybe_at()
    finished_at: datetime | None = _maybe_at()


class OutboxRecord(RuntimeRecord, table=True):
    """``dt_outbox``: one row per delivery intent; its monotonic id is the cutover watermark."""

    __tablename__ = "dt_outbox"
    # The dispatcher takes PENDING rows in due order (then id order): this index holds only
    # those, so a claim reads the due entries and stops at the first one not due yet, however
    # many SENT rows wait for `prune` and however many delayed rows wait for their time (an
    # index in id order walked past every delayed row on each pass). Its first entry past now
    # is when the dispatcher must wake next.
    __table_args__ = (
        sa.Index(
            "ix_dt_outbox_pending_due",
            "namespace",
            "next_attempt_at",
            "id",
            postgresql_where=sa.text("state = 'PENDING'"),
            sqlite_where=sa.text("state = 'PENDING'"),
        ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # SQLAlchemy takes a tuple
        # MySQL has no partial index: the PENDING rows of a namespace are one range of this one.
        sa.Index("ix_dt_outbox_state_due", "namespace", "state", "next_attempt_at", "id").ddl_if(
            dialect=_MYSQL  # type: ignore[arg-type]
        ),
        _HOT_UPDATES,
    )

    id: int | None = Field(default=None, primary_key=True)
    namespace: str = Field(max_length=64, sa_type=_ascii(64))
    task_id: str = Field(max_length=36, index=True, sa_type=_key(36))
    queue: str = Field(max_length=64, sa_type=_ascii(64))
    generation: int
    delivery: int
    state: str = Field(default=OutboxState.PENDING, max_length=16)
    attempts: int = 0
    next_attempt_at: datetime = _at()
    lease_expires_at: datetime | None = _maybe_at()
    claim_token: str | None = Field(default=None, max_length=36, sa_type=_key(36))
    last_error: str | None = Field(default=None, sa_type=sa.Text)
    shadow: bool = False
    stream_id: str | None = Field(default=None, max_length=64)
    partition: int | None = None
    created_at: datetime = _at()
    sent_at: datetime | None = _maybe_at()


class AttemptRecord(RuntimeRecord, table=True):
    """``dt_attempts``: the audit trail of every execution attempt, read by operators."""

    __tablename__ = "dt_attempts"
    __table_args__ = (sa.Index("ix_dt_attempts_task", "task_id", "generation", "attempt"), _HOT_UPDATES)

    id: int | None = Field(default=None, primary_key=True)
    namespace: str = Field(max_length=64, sa_type=_ascii(64))
    task_id: str = Field(max_length=36, sa_type=_key(36))
    generation: int
    attempt: int
    delivery: int
    worker_id: str = Field(max_length=200)
    started_at: datetime = _at()
    finished_at: datetime | None = _maybe_at()
    outcome: str | None = Field(default=None, max_length=16)
    error_type: str | None = Field(default=None, max_length=200)
    error_message: str | None = Field(default=None, sa_type=sa.Text)
    retry_reason: str | None = Field(default=None, sa_type=sa.Text)
    traceparent: str | None = Field(default=None, max_length=128)
    #: The failure's traceback, scrubbed and bounded (durable_tasks.failures).
    traceback: str | None = Field(default=None, sa_type=sa.Text)


class ScheduleRecord(RuntimeRecord, table=True):
    """``dt_schedules``: one row per periodic schedule of a namespace.

    What the code declared (``task_name``, ``spec``, ``catch_up``: written by the schedulers,
    read by listings and the dashboard without the application's code), whether an operator
    paused it (no deploy needed), and the last tick handled, which schedulers advance with a
    compare-and-set so that each tick is submitted by one of them.
    """

    __tablename__ = "dt_schedules"

    namespace: str = Field(primary_key=True, max_length=64, sa_type=_ascii(64))
    name: str = Field(primary_key=True, max_length=200, sa_type=_key(200))
    task_name: str = Field(max_length=200, sa_type=_key(200))
    spec: str = Field(max_length=300)
    catch_up: str = Field(max_length=16)
    paused: bool = False
    last_tick_at: datetime = _at()
    next_tick_at: datetime | None = _maybe_at()
    created_at: datetime = _at()
    updated_at: datetime = _at()


class PayloadRecord(RuntimeRecord, table=True):
    """``dt_payloads``: a large payload apart from its task row (:mod:`durable_tasks.store.payloads`)."""

    __tablename__ = "dt_payloads"
    task_id: str = Field(primary_key=True, max_length=36, sa_type=_key(36))
    payload: str = Field(sa_type=JsonText)


class AuditRecord(RuntimeRecord, table=True):
    """``dt_audit``: every operator action taken through the dashboard: who, what, when, result."""

    __tablename__ = "dt_audit"
    __table_args__ = (sa.Index("ix_dt_audit_ns", "namespace", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    namespace: str = Field(max_length=64, sa_type=_ascii(64))
    at: datetime = _at()
    actor: str = Field(max_length=200)
    action: str = Field(max_length=64)
    target: str = Field(sa_type=sa.Text)
    outcome: str = Field(sa_type=sa.Text)


class StepRecord(RuntimeRecord, table=True):
    """``dt_steps``: the step journal of one task generation (``durable_tasks.journal``): a
    recorded step's result, a child's outcome, a signal's payload, or a wait still open
    (``done`` false). Unique per task, generation and slot; written only under the task's fence
    (or, for a child's outcome and a signal, under the task row's lock)."""

    __tablename__ = "dt_steps"
    __table_args__ = (
        sa.UniqueConstraint("task_id", "generation", "slot", name="uq_dt_steps_slot"),
        # Open waits by kind, oldest first: the approvals listing reads only these.
        sa.Index("ix_dt_steps_open", "namespace", "kind", "id", postgresql_where=_NOT_DONE, sqlite_where=_NOT_DONE),
    )

    id: int | None = Field(default=None, primary_key=True)
    namespace: str = Field(max_length=64, sa_type=_ascii(64))
    task_id: str = Field(max_length=36, sa_type=_key(36))
    generation: int
    slot: str = Field(max_length=200, sa_type=_key(200))
    kind: str = Field(max_length=16)
    label: str = Field(max_length=200)
    done: bool = False
    result: str | None = Field(default=None, sa_type=JsonText)
    request: str | None = Field(default=None, sa_type=JsonText)
    child_task_id: str | None = Field(default=None, max_length=36, sa_type=_key(36))
    child_state: str | None = Field(default=None, max_length=16)
    error_type: str | None = Field(default=None, max_length=200)
    error_message: str | None = Field(default=None, sa_type=sa.Text)
    created_at: datetime = _at()
    finished_at: datetime | None = _maybe_at()


class AgentRun(RuntimeRecord, table=True):
    """``dt_agent_runs``: one agent run, its current generation and final answer."""

    __tablename__ = "dt_agent_runs"
    # The dashboard's list of runs, newest first (durable_tasks.readmodel.agent_runs).
    __table_args__ = (sa.Index("ix_dt_agent_runs_created", "namespace", "created_at", "id"),)
    id: str = Field(primary_key=True, max_length=36, sa_type=_key(36))
    namespace: str = Field(max_length=64, sa_type=_ascii(64))
    agent: str = Field(max_length=200)
    generation: int = 0
    state: str = Field(default="RUNNING", max_length=16)
    input: str = Field(sa_type=JsonText)
    output: str | None = Field(default=None, sa_type=JsonText)
    created_at: datetime
    finished_at: datetime | None = None


class AgentTurn(RuntimeRecord, table=True):
    """``dt_agent_turns``: one recorded model turn and, once settled, its tool results."""

    __tablename__ = "dt_agent_turns"
    __table_args__ = (sa.UniqueConstraint("run_id", "generation", "index", name="uq_dt_agent_turn"),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(max_length=36, index=True, sa_type=_key(36))
    generation: int
    index: int
    output: str = Field(sa_type=JsonText)
    calls: str = Field(default="[]", sa_type=JsonText)  # [{id, task_id, error, result}] in call order
    tool_results: str | None = Field(default=None, sa_type=JsonText)
    created_at: datetime


tasks_table: sa.Table = TaskRecord.__table__  # type: ignore[attr-defined]
outbox_table: sa.Table = OutboxRecord.__table__  # type: ignore[attr-defined]
attempts_table: sa.Table = AttemptRecord.__table__  # type: ignore[attr-defined]
steps_table: sa.Table = StepRecord.__table__  # type: ignore[attr-defined]
schedules_table: sa.Table = ScheduleRecord.__table__  # type: ignore[attr-defined]
audit_table: sa.Table = AuditRecord.__table__  # type: ignore[attr-defined]
payloads_table: sa.Table = PayloadRecord.__table__  # type: ignore[attr-defined]
