"""Applying steps: the version table, the status of a database, migrate, and the SQL a DBA
reviews instead.

Each applied step is one row of ``dt_migrations`` (version, name, phase, applied_at), written in
the step's own transaction, so a database is always at a whole version. A database made before
versioning (the tables, no ``dt_migrations``) is compared with version 1 and, when it matches,
recorded at the version it matches (version 1 where the later steps say ``IF NOT EXISTS``)
without touching its tables.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from ..errors import MigrationError
from ..records import tasks_table
from .backends import Backend, backend_for, execute
from .schema import differences, is_extra, reflect_shape
from .steps import BACKENDS, Phase, Step, load_steps

__all__ = [
    "VERSION_TABLE",
    "MigrationReport",
    "SchemaStatus",
    "apply_steps",
    "migrate",
    "read_status",
    "render_sql",
    "steps_for",
]

logger = logging.getLogger(__name__)

_bookkeeping = sa.MetaData()
#: One row per applied step.
versions = sa.Table(
    "dt_migrations",
    _bookkeeping,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
)
VERSION_TABLE = versions.name
#: The name recorded for the steps whose schema existing tables were found to have.
ADOPTED = "adopted"


def steps_for(dialect: sa.Dialect) -> tuple[Step, ...]:
    """The steps shipped for this database's backend."""
    return load_steps(backend_for(dialect).name)


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database stands against the steps this code ships for its backend.

    ``version`` is None when there is no version table: then ``has_tables`` tells a database
    made before versioning from an empty one. ``floor`` is the oldest code (by the last step it
    knows) that can run on the database: the last post-deploy step applied.
    """

    version: int | None
    floor: int
    has_tables: bool
    steps: tuple[Step, ...]

    @property
    def latest(self) -> int:
        """The last step this code ships."""
        return self.steps[-1].version

    @property
    def required(self) -> int:
        """The version this code needs: its last pre-deploy step (post-deploy steps after it
        contract what older code used, and this code runs without them)."""
        return max(s.version for s in self.steps if s.phase is Phase.PRE_DEPLOY)

    @property
    def pending(self) -> tuple[Step, ...]:
        """The steps not applied yet."""
        return tuple(s for s in self.steps if s.version > (self.version or 0))

    def describe(self) -> str:
        """One line: the version, and how it compares with this code's."""
        if self.version is None:
            made = "tables made before versioning" if self.has_tables else "no durable_tasks tables"
            return f"{made}; this code's latest is version {self.latest}"
        return f"schema version {self.version}; this code needs {self.required}, latest {self.latest}"


def read_status(conn: sa.Connection) -> SchemaStatus:
    """The status of the database ``conn`` is on (reads only)."""
    steps = steps_for(conn.dialect)
    inspector = sa.inspect(conn)
    has_tables = inspector.has_table(tasks_table.name)
    if not inspector.has_table(VERSION_TABLE):
        return SchemaStatus(None, 1, has_tables, steps)
    v = versions.c
    post_deploy = sa.case((v.phase == Phase.POST_DEPLOY.value, v.version))  # FILTER is not MySQL's
    row = conn.execute(sa.select(sa.func.max(v.version), sa.func.max(post_deploy))).one()
    return SchemaStatus(row[0], row[1] or 1, has_tables, steps)


@dataclass(slots=True)
class MigrationReport:
    """What one ``migrate`` did: the version before (None: unversioned or empty) and after,
    the steps applied, the version existing tables were recorded at (0: none), whether it
    waited for another migrator."""

    before: int | None
    after: int
    applied: list[Step] = field(default_factory=list)
    adopted: int = 0
    waited: bool = False


Block = Callable[[], AbstractContextManager[object]]


def migrate(
    engine: sa.Engine,
    *,
    to: int | None = None,
    pre_deploy: bool = False,
    on_wait: Callable[[], None] | None = None,
) -> MigrationReport:
    """Bring the database to version ``to`` (default: the latest; with ``pre_deploy``, the
    version this code needs), one transaction per step, migrators serialized by the backend's
    lock (``on_wait`` is called if another holds it). A database already there is left alone."""
    with engine.connect() as conn:
        backend = backend_for(conn.dialect)
        waited = backend.lock(conn, on_wait)
        try:
            report = _migrate_locked(conn, backend, to=to, pre_deploy=pre_deploy)
        finally:
            _release(conn, backend)
    report.waited = waited
    return report


def _release(conn: sa.Connection, backend: Backend) -> None:
    """Release the migrators' lock whatever state an error left the session in: a transaction
    still open (aborted, on PostgreSQL, after a failed statement) is rolled back first; a
    session that still cannot release it is closed, which releases it too. Either way the
    connection goes back to the pool without the lock, and the error that ended the run is the
    one raised."""
    try:
        if conn.in_transaction():
            conn.rollback()
        backend.unlock(conn)
    except sa.exc.DBAPIError as exc:
        logger.warning("releasing the migrators' lock failed (%s): closing the connection instead", exc.orig)
        conn.invalidate()


def _migrate_locked(conn: sa.Connection, backend: Backend, *, to: int | None, pre_deploy: bool) -> MigrationReport:
    with conn.begin():
        versions.create(conn, checkfirst=True)
    status = read_status(conn)
    conn.commit()
    target = _target(status, to, pre_deploy)

    def transaction() -> AbstractContextManager[object]:
        if conn.in_transaction():  # a read began one
            conn.commit()
        return conn.begin()

    @contextlib.contextmanager
    def autocommit() -> Iterator[object]:
        if conn.in_transaction():
            conn.commit()
        level = conn.get_isolation_level()
        conn.execution_options(isolation_level="AUTOCOMMIT")
        try:
            yield None
        finally:
            if conn.in_transaction():  # SQLAlchemy's own bookkeeping: nothing is open on the server
                conn.commit()
            conn.execution_options(isolation_level=level)

    applied = apply_steps(conn, backend, status, target, transaction=transaction, outside=autocommit)
    v = versions.c
    # Read back, not taken from ``applied``: on SQLite another migrator may have applied the steps.
    after = conn.execute(sa.select(sa.func.max(v.version))).scalar() or 0
    adopted = 0
    if status.has_tables and not status.version and applied:
        adopted = conn.execute(sa.select(sa.func.max(v.version)).where(v.name == ADOPTED)).scalar() or 0
    conn.commit()
    return MigrationReport(status.version or None, after, applied, adopted)


def _target(status: SchemaStatus, to: int | None, pre_deploy: bool) -> int:
    target = to if to is not None else status.required if pre_deploy else status.latest
    if not 1 <= target <= status.latest:
        raise MigrationError(f"there is no version {target}: this code ships versions 1 to {status.latest}")
    if status.version is not None and target < status.version:
        raise MigrationError(f"the schema is at version {status.version}, past {target}; migrations only go forward")
    return target


def apply_steps(
    conn: sa.Connection,
    backend: Backend,
    status: SchemaStatus,
    target: int,
    *,
    transaction: Block,
    outside: Block,
) -> list[Step]:
    """Apply every step after the database's version up to ``target``; each transactional step
    inside ``transaction()`` with its version row, the others statement by statement inside
    ``outside()`` (autocommit), their version row after; in a new database, where this run
    makes every table, those run in a transaction too. A database made before versioning is
    first compared with version 1 and recorded as it."""
    applied: list[Step] = []
    new_database = not status.has_tables  # every table is made by this run: nobody else uses them
    done = status.version or 0
    for step in status.steps:
        if step.version > target:
            break
        if step.version == 1 and status.has_tables and not status.version:
            adopted = _adopt(conn, backend, status.steps[:target], transaction)
            applied += adopted
            done = adopted[-1].version
            continue
        if step.version <= done:
            continue
        if step.transactional or new_database:
            with transaction():
                if _already_applied(conn, step):  # another migrator (SQLite) got there first
                    continue
                for statement in step.statements:
                    execute(conn, statement if step.transactional else backend.in_transaction(statement))
                _record(conn, step)
        else:
            with outside():
                for statement in step.statements:
                    backend.before_outside_transaction(conn, statement)
                    execute(conn, statement)
            with transaction():
                _record(conn, step)
        logger.info("applied migration %s (%s)", step.label, step.phase.value)
        applied.append(step)
    return applied


def _already_applied(conn: sa.Connection, step: Step) -> bool:
    return conn.execute(sa.select(versions.c.version).where(versions.c.version == step.version)).first() is not None


def _record(conn: sa.Connection, step: Step, *, name: str | None = None) -> None:
    conn.execute(
        versions.insert().values(
            version=step.version, name=name or step.name, phase=step.phase.value, applied_at=datetime.now(UTC)
        )
    )


def _adopt(conn: sa.Connection, backend: Backend, steps: Sequence[Step], transaction: Block) -> list[Step]:
    """Record tables made before versioning at the version they are shown to have (steps
    1..N, each named ``adopted``); version-1 tables that code never made (the agent tables
    exist only where the app imported durable_tasks.agents) are created. Returns steps 1..N."""
    version, problems, absent = existing_version(conn, backend, steps)
    baseline = steps[0]
    if problems:
        raise MigrationError(
            f"the durable_tasks tables predate schema versioning and differ from version {version}: "
            + "; ".join(problems)
            + f". Make them match durable_tasks/migrations/{BACKENDS[backend.name]}/{steps[version - 1].label}.sql "
            f"{'' if version == 1 else '(and the steps before it) '}then run `durable-tasks migrate` again"
        )
    with transaction():
        if not _already_applied(conn, baseline):
            for step in steps[:version]:
                for statement in statements_for_tables(step, absent):
                    execute(conn, statement)
            for step in steps[:version]:
                for statement in step.statements if step.run_when_adopted else ():
                    execute(conn, statement)
                _record(conn, step, name=ADOPTED)
    logger.info("recorded the existing tables as migration %s", steps[version - 1].label)
    return list(steps[:version])


def existing_version(conn: sa.Connection, backend: Backend, steps: Sequence[Step]) -> tuple[int, list[str], set[str]]:
    """The highest version whose schema an unversioned database's tables have (the version-1
    tables it lacks aside: code made the agent tables only where the app imported them), and
    those tables; else the closest version and how the tables
    differ from it. Extra indexes and columns an operator added are allowed."""
    actual = reflect_shape(conn)
    shapes = backend.version_shapes(conn, steps)
    absent = {name for name, shape in actual.items() if shape is None and shapes[0].get(name) is not None}
    closest: tuple[int, list[str], set[str]] | None = None
    for version, expected in enumerate(shapes, start=1):
        problems = [
            line
            for line in differences(actual, expected)
            if not is_extra(line) and line.removeprefix("missing table ") not in absent
        ]
        if not problems:
            closest = (version, [], absent)
        elif closest is None or (closest[1] and len(problems) < len(closest[1])):
            closest = (version, problems, absent)
    if closest is None:  # pragma: no cover - every backend builds version 1
        raise MigrationError("no migration steps to compare the existing tables with")
    return closest


_CREATES = re.compile(r"^\s*CREATE\s+(?:TABLE\s+|(?:UNIQUE\s+)?INDEX\s+\w+\s+ON\s+)\"?(\w+)", re.IGNORECASE)


def statements_for_tables(step: Step, tables: set[str]) -> list[str]:
    """The statements of ``step`` that create ``tables`` or their indexes."""
    return [s for s in step.statements if (m := _CREATES.match(s)) is not None and m.group(1) in tables]


def render_sql(conn: sa.Connection, *, to: int | None = None, pre_deploy: bool = False) -> str:
    """The SQL ``migrate`` would run from the database's version to ``to``, for review or to
    apply by hand (it includes the version table and its rows). Reads only (on MySQL, the
    versions that unversioned tables may match are built in a scratch database)."""
    status = read_status(conn)
    target = _target(status, to, pre_deploy)
    dialect = conn.dialect
    out = [f"-- durable_tasks migrations for {dialect.name}: {status.describe()}; to version {target}"]
    if status.version is None:
        out.append(f"-- the version table, {VERSION_TABLE}: one row per applied step")
        out.append(str(sa.schema.CreateTable(versions).compile(dialect=dialect)).strip() + ";")
    adopt_to, absent = 0, set[str]()
    if status.has_tables and not status.version:
        adopt_to, _, absent = existing_version(conn, backend_for(dialect), status.steps[:target])
    for step in status.pending:
        if step.version > target:
            break
        out.append(f"\n-- {step.label} ({step.phase.value}{'' if step.transactional else ', outside a transaction'})")
        adopt = step.version <= adopt_to
        if adopt:
            out.append(f"-- the tables exist already: record them as version {adopt_to}")
            out += [statement + ";" for statement in statements_for_tables(step, absent)]
            if step.run_when_adopted:
                out.append(step.source.strip())
        if step.transactional and not adopt:
            out.append("BEGIN;")
        if not adopt:
            out.append(step.source.strip())
        row = versions.insert().values(
            version=step.version, name=ADOPTED if adopt else step.name, phase=step.phase.value
        )
        insert = row.values(applied_at=sa.func.current_timestamp())
        out.append(str(insert.compile(dialect=dialect, compile_kwargs={"literal_binds": True})) + ";")
        if step.transactional and not adopt:
            out.append("COMMIT;")
    return "\n".join(out) + "\n"
