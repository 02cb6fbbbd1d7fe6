"""The store on MySQL 8 and MariaDB >= 10.6, over PyMySQL (``mysql+pymysql://``).

Written to what both share: no ``RETURNING`` on UPDATE, ``SELECT … FOR UPDATE SKIP LOCKED``,
``INSERT … ON DUPLICATE KEY UPDATE``. Every transaction runs at READ COMMITTED (no gap locks
between the dispatcher's and the workers' row locks). A claim, a lease, a group commit and a
renewal each lock their rows first, in ascending id order (the order every multi-row write of
``dt_tasks`` takes on every backend), then update them, then read back what they need, in one
transaction. InnoDB reports a deadlock or a lock wait timeout as an error: the store runs the
whole transaction again (a few times, with a short random pause); anything else is an outage,
as on the other backends.

There is no LISTEN/NOTIFY: dispatchers poll the outbox every ``poll_interval``, and the runtime
wakes them earlier with a Redis message after each committed submit (:mod:`durable_tasks.wakeup`).
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ..errors import ConfigurationError
from ..records import CLAIMABLE_STATES, OutboxState, TaskState, outbox_table, tasks_table
from ..settings import Settings
from . import execution, outbox, results
from .base import SqlStore
from .engine import ping_when_idle
from .execution import ClaimedRow, ClaimRefused, ClaimRequest, ExecutionClaim
from .outbox import ClaimedDelivery, Sent
from .protocol import DatabaseFacts, DatabaseProblem
from .results import FinalWrite
from .submit import NewTask, find_by_key, insert_outbox, task_row

__all__ = ["MySqlStore"]

R = TypeVar("R")
t = tasks_table.c
o = outbox_table.c
logger = logging.getLogger(__name__)

#: InnoDB's "deadlock found" and "lock wait timeout exceeded": the transaction is rolled back
#: (or its statement is), and running it again is the documented answer.
_RETRYABLE = (1213, 1205)
_ATTEMPTS = 5


class MySqlStore(SqlStore):
    """:class:`~.protocol.Store` on MySQL 8 / MariaDB >= 10.6 (InnoDB)."""

    @classmethod
    def open(cls, url: sa.URL, settings: Settings | None = None) -> MySqlStore:
        """A store on the database at ``url`` (``mysql://`` and ``mariadb://`` mean PyMySQL)."""
        if settings is not None and settings.max_payload_bytes > MEDIUMTEXT_BYTES:
            raise ConfigurationError(
                f"max_payload_bytes={settings.max_payload_bytes} is over the {MEDIUMTEXT_BYTES:,} bytes that "
                f"MySQL/MariaDB store in a payload or result; set DT_MAX_PAYLOAD_BYTES to {MEDIUMTEXT_BYTES} or less"
            )
        if url.drivername in ("mysql", "mariadb"):
            url = url.set(drivername=f"{url.drivername}+pymysql")
        if "charset" not in url.query:
            url = url.update_query_dict({"charset": "utf8mb4"})
        engine = sa.create_engine(url, pool_size=10, max_overflow=20, isolation_level="READ COMMITTED")
        ping_when_idle(engine)
        store = cls(engine)
        if settings is not None:
            store.max_value_bytes = settings.max_payload_bytes
        return store

    #: The largest payload or result the runtime writes (``max_payload_bytes``): doctor checks
    #: that one statement of that size fits the server's ``max_allowed_packet``.
    max_value_bytes = 1024 * 1024

    # -- what MySQL does differently --------------------------------------------------------

    def _insert_task(self, conn: sa.Connection, task: NewTask, task_id: str, now: datetime, *, aside: bool) -> bool:
        row = task_row(task, task_id, now, aside=aside)
        if task.idempotency_key is None:  # NULL keys never conflict
            conn.execute(_INSERT_TASK, row)
        else:  # a duplicate key waits for the other transaction, then changes nothing
            # "id = dt_tasks.id": a no-op on the existing row (VALUES(id) would rename it).
            conn.execute(_INSERT_TASK_KEYED, row)
            found = find_by_key(conn, task)
            if found is None or found.task_id != task_id:
                return False
        insert_outbox(conn, task.namespace, task_id, task.queue, 0, 0, task.shadow, now, due=task.due)
        return True

    def _insert_tasks(self, conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
        # PyMySQL sends an executemany of an INSERT as multi-row INSERTs (ON DUPLICATE KEY too).
        if keyless := [row for row in rows if row["idempotency_key"] is None]:
            conn.execute(_INSERT_TASK, keyless)
        # Keys in one order (a stable sort: a key twice, the first written first): two batches
        # that share keys wait for each other one way only, never in a cycle.
        if keyed := sorted(
            (row for row in rows if row["idempotency_key"] is not None),
            key=lambda row: (row["name"], row["idempotency_key"]),
        ):
            conn.execute(_INSERT_TASK_KEYED, keyed)

    def _lock_tasks(self, conn: sa.Connection, task_ids: Sequence[str]) -> None:
        if task_ids:
            conn.execute(_LOCK_TASKS, {"ids": list(task_ids)}).all()

    def _mark_sent(self, conn: sa.Connection, sent: Sequence[Sent], now: datetime) -> int:
        self._lock_tasks(conn, sorted({row.task_id for row, _, _ in sent}))
        return outbox.mark_sent_at_once(conn, sent, now=now)

    def _commit_plain(self, conn: sa.Connection, writes: Sequence[FinalWrite], now: datetime) -> list[FinalWrite]:
        locked = _lock_running(conn, [w.claim for w in writes])
        current = [w for w in writes if locked.get(w.claim.task_id) == _token(w.claim)]
        for part in _parts_of_bounded_size(current):
            conn.execute(
                sa.update(tasks_table)
                .where(t.id.in_([w.claim.task_id for w in part]))
                .values(
                    **results.SUCCEEDED,
                    finished_at=now,
                    result=sa.case({w.claim.task_id: w.result_json for w in part}, value=t.id),
                )
            )
        results.set_outcomes(writes, {w.claim.task_id for w in current})
        return list(writes)

    def _server_now(self, conn: sa.Connection) -> datetime | None:
        now: datetime = conn.execute(sa.text("SELECT UTC_TIMESTAMP(6)")).scalar_one()
        return now.replace(tzinfo=UTC)

    async def _in_thread(self, call: Callable[[], R]) -> R:
        """Run one transaction; again after a deadlock or a lock wait timeout."""
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await anyio.to_thread.run_sync(call)
            except sa.exc.OperationalError as exc:
                code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
                if code not in _RETRYABLE or attempt == _ATTEMPTS:
                    raise
                # A deadlock is worth seeing (the lock order should prevent it); a retry absorbs it.
                logger.warning("transaction hit InnoDB error %s (attempt %d); running it again", code, attempt)
                await anyio.sleep(random.uniform(0.005, 0.05) * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the hot paths: lock in id order, update, read back ----------------------------------

    async def lease_outbox(
        self, namespace: str, *, now: datetime, lease: timedelta, limit: int, watermark: int | None
    ) -> list[ClaimedDelivery]:
        """SKIP LOCKED splits the due rows between dispatchers."""
        token = str(uuid.uuid4())

        def lease_rows() -> list[ClaimedDelivery]:
            due = sa.select(o.id).where(
                o.namespace == namespace,
                o.state == OutboxState.PENDING,
                o.next_attempt_at <= now,
                sa.or_(o.lease_expires_at.is_(None), o.lease_expires_at <= now),
            )
            if watermark is not None:
                due = due.where(o.id >= watermark)
            with self.engine.begin() as conn:
                ordered = due.order_by(o.next_attempt_at, o.id).limit(limit)
                ids = list(conn.execute(ordered.with_for_update(skip_locked=True)).scalars())
                if not ids:
                    return []
                conn.execute(
                    sa.update(outbox_table).where(o.id.in_(ids)).values(lease_expires_at=now + lease, claim_token=token)
                )
                rows = conn.execute(outbox.claimed_rows(ids)).all()
            return outbox.deliveries(rows, token)

        return await self._in_thread(lease_rows)

    async def claim_executions(
        self,
        namespace: str,
        requests: Sequence[ClaimRequest],
        *,
        worker_id: str,
        now: datetime,
        lease: timedelta,
        hold: bool = False,
    ) -> list[ExecutionClaim | ClaimRefused]:
        """Lock the batch's task rows (reading what a claim returns), claim the claimable ones.
        The claimed rows are the locked rows one attempt on, as the update leaves them: no
        statement reads them back (on PyMySQL, a round trip and a row decode in Python each)."""
        if not requests:
            return []
        keys, traceparents = execution.claim_keys(requests)
        wanted = set(keys)

        def claim() -> list[ExecutionClaim | ClaimRefused]:
            known = execution.NOTHING_KNOWN
            with self.engine.begin() as conn:
                locked = conn.execute(_LOCK_FOR_CLAIM, {"ids": sorted({k[0] for k in keys})}).all()
                rows = [
                    ClaimedRow._make(r[:_CLAIMED])._replace(attempt=r.attempt + 1)
                    for r in locked
                    if r.namespace == namespace and _claimable(r, wanted, now)
                ]
                if rows:
                    ids = [r.id for r in rows]
                    claimed = {"ids": ids, "until": now + lease, "worker": worker_id, "now": now, "hold": hold}
                    conn.execute(_CLAIM, claimed)
                execution.open_attempts(conn, namespace, rows, traceparents, worker_id=worker_id, now=now)
                if follow_ups := execution.claim_follow_ups(requests, rows):
                    known = execution.after_claim(conn, namespace, follow_ups, now)
            return execution.claims_for(requests, rows, known, namespace=namespace, worker_id=worker_id, hold=hold)

        return await self._in_thread(claim)

    async def renew_leases(self, claims: Sequence[ExecutionClaim], *, now: datetime, lease: timedelta) -> set[str]:
        """Lock the rows, extend the leases still held."""
        if not claims:
            return set()

        def renew() -> set[str]:
            with self.engine.begin() as conn:
                locked = _lock_running(conn, claims)
                held = [c.task_id for c in claims if locked.get(c.task_id) == _token(c)]
                if held:
                    conn.execute(sa.update(tasks_table).where(t.id.in_(held)).values(lease_expires_at=now + lease))
            return set(held)

        return await self._in_thread(renew)

    # -- doctor -------------------------------------------------------------------------------

    async def facts(self) -> DatabaseFacts:
        """The shared facts, plus the server settings that can lose or duplicate work."""
        facts = await super().facts()

        def read() -> list[DatabaseProblem]:
            with self.engine.connect() as conn:
                return _problems(conn, self.max_value_bytes)

        facts.problems = await self._in_thread(read)
        return facts


#: A new task; with an idempotency key, one that changes nothing where the key is taken (built
#: once, as the outbox row's insert is: :mod:`.submit`).
_INSERT_TASK = sa.insert(tasks_table)
_INSERT_TASK_KEYED = mysql.insert(tasks_table).on_duplicate_key_update(id=t.id)
#: The task rows of the list ``ids`` (an expanding bind parameter).
_BY_IDS = t.id.in_(sa.bindparam("ids", expanding=True))


#: Characters of results one group commit statement carries at most (a larger result goes
#: alone): a statement must fit the server's ``max_allowed_packet`` (16 MiB on MariaDB, 64 MiB
#: on MySQL 8), and 512 results of a megabyte each would not.
_STATEMENT_CHARS = 1024 * 1024
#: What a MEDIUMTEXT column (a payload, a result) holds.
MEDIUMTEXT_BYTES = 16 * 1024 * 1024 - 1


def _parts_of_bounded_size(writes: Sequence[FinalWrite]) -> Iterator[list[FinalWrite]]:
    """``writes`` in order, in parts whose results hold at most ``_STATEMENT_CHARS`` together."""
    part: list[FinalWrite] = []
    size = 0
    for w in writes:
        if part and size + len(w.result_json) > _STATEMENT_CHARS:
            yield part
            part, size = [], 0
        part.append(w)
        size += len(w.result_json)
    if part:
        yield part


def _locking(*columns: Any) -> sa.Select[Any]:
    """``columns`` of the task rows ``ids``, locked in id order (the order every transaction
    here takes task locks in, so two of them never wait on each other in a cycle)."""
    return sa.select(*columns).where(_BY_IDS).order_by(t.id).with_for_update()


#: The claim's two statements and the locks of task rows, built once: SQLAlchemy builds a
#: statement in Python (about 40 argument coercions for the claim's two), and these run for
#: every read batch, group commit and dispatch pass.
_LOCK_FOR_CLAIM = _locking(*execution.CLAIMED_COLUMNS, t.namespace, t.state, t.lease_expires_at)
_CLAIM = sa.update(tasks_table).where(_BY_IDS).values(execution.CLAIM_VALUES)
_LOCK_TASKS = _locking(t.id)
_LOCK_FOR_COMMIT = _locking(t.id, t.namespace, t.state, t.generation, t.attempt)
#: The columns of a claimed row at the head of the claim's locking read.
_CLAIMED = len(ClaimedRow._fields)


def _token(claim: ExecutionClaim) -> tuple[str, int, int]:
    return (claim.namespace, claim.generation, claim.attempt)


def _lock_running(conn: sa.Connection, claims: Sequence[ExecutionClaim]) -> dict[str, tuple[str, int, int]]:
    """Lock the claims' task rows in id order; the (namespace, generation, attempt) of those
    still RUNNING."""
    rows = conn.execute(_LOCK_FOR_COMMIT, {"ids": sorted({c.task_id for c in claims})}).all()
    return {r.id: (r.namespace, r.generation, r.attempt) for r in rows if r.state == TaskState.RUNNING}


def _claimable(row: Any, wanted: set[tuple[str, int, int]], now: datetime) -> bool:
    if (row.id, row.generation, row.delivery) not in wanted:
        return False
    if row.state in CLAIMABLE_STATES:
        return True
    return bool(row.state == TaskState.RUNNING and row.lease_expires_at is not None and row.lease_expires_at <= now)


def _variable(conn: sa.Connection, *names: str) -> str | None:
    """The first of these server variables the server knows (MySQL and MariaDB name some apart)."""
    for name in names:
        try:
            value = conn.execute(sa.text(f"SELECT @@{name}")).scalar()
        except sa.exc.DBAPIError:
            continue
        return None if value is None else str(value)
    return None


def _problems(conn: sa.Connection, max_value_bytes: int) -> list[DatabaseProblem]:
    found: list[DatabaseProblem] = []
    packet = _variable(conn, "max_allowed_packet")
    # One statement carries a payload (a submit's insert) or up to _STATEMENT_CHARS of results
    # (a group commit), and a larger result alone, with its SQL around it.
    needed = max(max_value_bytes, _STATEMENT_CHARS) + 64 * 1024
    if packet is not None and int(packet) < needed:
        found.append(
            DatabaseProblem(
                "max_allowed_packet",
                f"is {int(packet):,} bytes, under the {needed:,} that a payload or result of max_payload_bytes "
                f"({max_value_bytes:,}) takes in one statement: such a write fails. Raise max_allowed_packet to "
                f"{needed} or more, or lower DT_MAX_PAYLOAD_BYTES.",
            )
        )
    isolation = _variable(conn, "session.transaction_isolation", "session.tx_isolation") or "?"
    if isolation.upper().replace("-", " ") != "READ COMMITTED":
        found.append(
            DatabaseProblem(
                "isolation",
                f"the runtime's connections run at {isolation}, not READ COMMITTED: gap locks can make "
                "claims and commits deadlock (something overrides the engine's isolation_level).",
            )
        )
    mode = _variable(conn, "session.sql_mode")
    if mode is not None and not {"STRICT_TRANS_TABLES", "STRICT_ALL_TABLES"} & set(mode.upper().split(",")):
        found.append(
            DatabaseProblem(
                "sql_mode",
                f"is {mode or 'empty'!r}, without STRICT_TRANS_TABLES: a value too long for its column is cut "
                "short with a warning, not refused. Add STRICT_TRANS_TABLES to the server's sql_mode.",
            )
        )
    flush = _variable(conn, "innodb_flush_log_at_trx_commit")
    if flush is not None and flush != "1":
        found.append(
            DatabaseProblem(
                "innodb_flush_log_at_trx_commit",
                f"is {flush}: a crash can lose committed submissions (their outbox rows). Set it to 1.",
            )
        )
    if _variable(conn, "log_bin") in ("1", "ON") and _variable(conn, "sync_binlog") != "1":
        found.append(
            DatabaseProblem(
                "sync_binlog",
                "is not 1 while the binary log is on: a crash can lose committed transactions from the binlog "
                "(a replica promoted after it lacks them). Set sync_binlog = 1.",
                severe=False,
            )
        )
    wait = _variable(conn, "innodb_lock_wait_timeout")
    if wait is not None and int(wait) > 120:
        found.append(
            DatabaseProblem(
                "innodb_lock_wait_timeout",
                f"is {wait} s: a transaction stuck behind a lock holds a worker's slot that long. 50 s or less.",
                severe=False,
            )
        )
    return found
