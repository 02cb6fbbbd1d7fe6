"""Where a payload lives, and which payloads a batch statement carries with its rows.

A payload over :data:`ASIDE_PAYLOAD_BYTES` goes, on SQLite and MySQL/MariaDB, to a row of its
own in ``dt_payloads``, and its task row keeps ``''``. Both databases pay for a long value on
every change of its row: SQLite rewrites the row, long values included (11 to 13 bytes written
per payload byte over a task's life), and InnoDB reads the whole row for every locking read
and update of it, whatever the statement names (``benchmarks/mysql_row_reads.py``). A task row
is changed as it is dispatched, claimed and finished; the payload row is written once and read
once. PostgreSQL's store keeps every payload in ``dt_tasks``: TOAST keeps a long value apart
already, and an update of other columns keeps its pointer.

Code from schema version 16 on reads a payload with :func:`stored_payload` wherever it reads
one; a store writes payloads aside only once version 17 (post-deploy) is applied, after which
code older than 16, which would read the ``''``, refuses to start (:class:`AsideGate`).

A dispatcher's pass and a worker's claim each read hundreds of task rows at once. Carrying every
payload would make what one batch holds grow with its payloads: a dispatcher pass of 500
payloads of 1 MB peaked at 1 GB, a worker at its default concurrency held 1.1 GB. Each batch
statement carries the payloads up to :data:`INLINE_PAYLOAD_BYTES` and NULL in place of a larger
one, which its reader fetches alone (:meth:`.base.SqlStore.read_payload`) when it needs it: a
dispatcher when it checks it, a worker within its ``payload_memory``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from ..records import payloads_table, tasks_table
from .engine import read_only

__all__ = [
    "ASIDE_PAYLOAD_BYTES",
    "ASIDE_STEP",
    "INLINE_PAYLOAD_BYTES",
    "AsideGate",
    "delete_payloads",
    "inline_payload",
    "insert_payloads",
    "payload_size",
    "stored_payload",
]

#: The largest payload a batch statement carries with its row: a pass of 500 rows holds at most
#: 32 MiB of them (up to four times that of tasks written without ``payload_bytes`` on SQLite,
#: whose ``length`` counts characters, in text outside ASCII).
INLINE_PAYLOAD_BYTES = 64 * 1024

#: A payload over this many bytes is written to ``dt_payloads`` (SQLite, MySQL/MariaDB): a
#: SQLite page is 4 KiB, and a longer row spills into overflow pages that each update rewrites.
#: Readers take a payload up to this size from the task row without looking: lowering it later
#: is safe, raising it would hide the payloads that code with the lower value kept apart.
ASIDE_PAYLOAD_BYTES = 4 * 1024

#: The schema step whose record lets a store write payloads aside (0017_payloads_aside).
ASIDE_STEP = 17
#: The migrations' version table (durable_tasks.migrations.runner, which imports the store).
_VERSIONS = "dt_migrations"

t = tasks_table.c
p = payloads_table.c


def payload_size() -> sa.ColumnElement[Any]:
    """The payload's size in bytes as submit wrote it (``payload_bytes``), or, for a task written
    without it (older code, ``dt_submit``), measured: bytes on MySQL (``LENGTH``), characters on
    SQLite (``length``, which reads a long value to count them). PostgreSQL's batch statements are
    its own SQL (``octet_length``, which reads a long value's header only).

    On MySQL/MariaDB a statement that names ``payload`` reads every long payload of its rows,
    whatever the CASE then keeps, and a locking read or an update reads the whole row whatever it
    names (``benchmarks/mysql_row_reads.py``): a payload kept aside leaves ``''`` there."""
    return sa.func.coalesce(t.payload_bytes, sa.func.length(t.payload))


def stored_payload() -> sa.ColumnElement[Any]:
    """The payload of the ``dt_tasks`` row in the enclosing statement, wherever it is: its row in
    ``dt_payloads`` (a primary-key probe), else the task row's own."""
    aside = sa.select(p.payload).where(p.task_id == t.id).correlate(tasks_table).scalar_subquery()
    return sa.func.coalesce(aside, t.payload)


def inline_payload() -> sa.ColumnElement[Any]:
    """The payload, or NULL when it is over :data:`INLINE_PAYLOAD_BYTES`. One up to
    :data:`ASIDE_PAYLOAD_BYTES` is always in the task row; a larger one may be in either place
    (written before version 17, or by ``dt_submit``), so it is looked up."""
    size = payload_size()
    return sa.case((size <= ASIDE_PAYLOAD_BYTES, t.payload), (size <= INLINE_PAYLOAD_BYTES, stored_payload()))


#: Built once and run with each row's values (see store/submit.py's _INSERT_OUTBOX).
_INSERT = sa.insert(payloads_table)


def insert_payloads(conn: sa.Connection, rows: Sequence[tuple[str, str]]) -> None:
    """Write the payloads of new tasks, ``(task id, payload JSON)``, in one executemany."""
    if rows:
        conn.execute(_INSERT, [{"task_id": task_id, "payload": payload} for task_id, payload in rows])


def delete_payloads(conn: sa.Connection, task_ids: Sequence[str]) -> None:
    """Delete what ``dt_payloads`` holds for the tasks ``task_ids`` (deleted with them)."""
    if task_ids:
        conn.execute(sa.delete(payloads_table).where(p.task_id.in_(task_ids)))


class AsideGate:
    """Whether this database lets a store write payloads aside: its schema has step
    :data:`ASIDE_STEP`. Read once it says yes (a step is never undone); while it says no, read
    again at most every :attr:`RECHECK` seconds, so a process that started before the
    post-deploy step begins within that once it is applied. Thread-safe: submits run on the
    application's threads."""

    #: Seconds between reads while the step is not applied.
    RECHECK = 60.0

    def __init__(self, engine: sa.Engine, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = read_only(engine)  # on SQLite a write lock would wait for the submit's own
        self._clock = clock
        self._open = False
        self._checked_at: float | None = None
        self._lock = threading.Lock()

    def open(self) -> bool:
        """Whether payloads may be written aside (a read of the version table at most every
        :attr:`RECHECK` seconds until it says yes)."""
        if self._open:
            return True
        with self._lock:
            now = self._clock()
            if self._checked_at is None or now - self._checked_at >= self.RECHECK:
                self._checked_at = now
                self._open = self._read()
            return self._open

    def _read(self) -> bool:
        with self._engine.connect() as conn:
            if not sa.inspect(conn).has_table(_VERSIONS):  # tables made before versioning
                return False
            query = sa.text(f"SELECT 1 FROM {_VERSIONS} WHERE version = :version")
            return conn.execute(query, {"version": ASIDE_STEP}).first() is not None
