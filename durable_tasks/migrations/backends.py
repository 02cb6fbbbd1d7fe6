"""What applying migrations needs that differs per database: serializing migrators, running a
statement outside a transaction, and building the versions somewhere private to compare an
unversioned database with them. One class per backend, chosen once by :func:`backend_for`."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import sqlalchemy as sa

from ..errors import ConfigurationError, MigrationError
from .schema import TableShape, reflect_shape
from .steps import BACKENDS, Step

__all__ = ["LOCK_CLASS", "Backend", "backend_for", "execute"]

#: First key of the PostgreSQL advisory lock that serializes migrators ("dt_m"); the second
#: is the schema's name hashed, so two schemas of one database migrate independently.
LOCK_CLASS = 0x64745F6D

_CONCURRENT_INDEX = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE
)


def execute(conn: sa.Connection, statement: str) -> None:
    """Run one statement of a migration file as written (no parameter markers: a ``%`` in a
    function body stays a ``%``)."""
    conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


class Backend(Protocol):
    """The per-database side of the runner."""

    name: str

    def lock(self, conn: sa.Connection, on_wait: Callable[[], None] | None) -> bool:
        """Serialize migrators for the rest of this connection's session; True if it had to
        wait for another (``on_wait`` is called before waiting)."""
        ...

    def unlock(self, conn: sa.Connection) -> None:
        """Release :meth:`lock`."""
        ...

    def lock_in_transaction(self, conn: sa.Connection) -> None:
        """Serialize migrators until the current transaction ends (the Alembic path)."""
        ...

    def before_outside_transaction(self, conn: sa.Connection, statement: str) -> None:
        """Clean up what an interrupted earlier run of ``statement`` left (run in autocommit)."""
        ...

    def version_shapes(self, conn: sa.Connection, steps: Sequence[Step]) -> list[dict[str, TableShape | None]]:
        """The shapes an unversioned database may be adopted at: after ``steps[0]`` (version
        1), and after each later step where later steps cannot run on tables that unversioned
        code made already; built where nobody sees them and thrown away."""
        ...

    def in_transaction(self, statement: str) -> str:
        """``statement`` as it runs inside a transaction, on tables nobody else uses yet."""
        ...


class PostgresBackend:
    """Advisory locks; ``CREATE INDEX CONCURRENTLY`` outside transactions; version 1 built in a
    scratch schema inside a transaction that is rolled back."""

    name = "postgresql"
    _KEY = f"{LOCK_CLASS}, hashtext(current_schema())"

    def lock(self, conn: sa.Connection, on_wait: Callable[[], None] | None) -> bool:
        """Session advisory lock, held across the steps' own transactions.

        A waiting migrator tries again and again rather than blocking in ``pg_advisory_lock``:
        a blocked statement keeps a snapshot open, and ``CREATE INDEX CONCURRENTLY`` in the
        migrator holding the lock waits for every older snapshot to end, a deadlock."""
        delay = 0.05
        waited = False
        while True:
            got = conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({self._KEY})").scalar()
            conn.commit()
            if got:
                return waited
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def unlock(self, conn: sa.Connection) -> None:
        """Release the session lock."""
        conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self._KEY})")
        conn.commit()

    def lock_in_transaction(self, conn: sa.Connection) -> None:
        """Transaction advisory lock: released at commit or rollback."""
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({self._KEY})")

    def before_outside_transaction(self, conn: sa.Connection, statement: str) -> None:
        """An interrupted ``CREATE INDEX CONCURRENTLY`` leaves an INVALID index of that name:
        drop it, so that the statement builds it again (``IF NOT EXISTS`` would keep it)."""
        match = _CONCURRENT_INDEX.match(statement)
        if match is None:
            return
        invalid = conn.execute(
            sa.text(
                "SELECT 1 FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
                "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                "WHERE c.relname = :name AND n.nspname = current_schema() AND NOT i.indisvalid"
            ),
            {"name": match.group(1)},
        ).first()
        if invalid is not None:
            conn.exec_driver_sql(f'DROP INDEX CONCURRENTLY IF EXISTS "{match.group(1)}"')

    def in_transaction(self, statement: str) -> str:
        """Without ``CONCURRENTLY``: on tables created by the same ``migrate`` run (a new
        database), a plain build is instant and waits for no other transaction."""
        return re.sub(r"\bCONCURRENTLY\s+", "", statement, count=1, flags=re.IGNORECASE)

    def version_shapes(self, conn: sa.Connection, steps: Sequence[Step]) -> list[dict[str, TableShape | None]]:
        """Version 1 only (the later steps say ``IF NOT EXISTS``), in a scratch schema; the
        transaction (or the savepoint, inside the caller's transaction) is rolled back, so
        nothing stays."""
        step = steps[0]
        scratch = f"dt_scratch_{uuid.uuid4().hex[:12]}"
        tx = conn.begin_nested() if conn.in_transaction() else conn.begin()
        try:
            conn.exec_driver_sql(f'CREATE SCHEMA "{scratch}"')
            conn.exec_driver_sql(f'SET LOCAL search_path TO "{scratch}"')
            for statement in step.statements:
                execute(conn, statement)
            return [reflect_shape(conn, schema=scratch)]
        finally:
            tx.rollback()


class SqliteBackend:
    """One writer at a time already (every step runs under BEGIN IMMEDIATE); version 1 built in
    a private in-memory database."""

    name = "sqlite"

    def lock(self, conn: sa.Connection, on_wait: Callable[[], None] | None) -> bool:
        """Nothing to take: the write lock of each step's transaction serializes migrators."""
        return False

    def unlock(self, conn: sa.Connection) -> None:
        """Nothing to release."""

    def lock_in_transaction(self, conn: sa.Connection) -> None:
        """The transaction's write lock is the lock."""

    def before_outside_transaction(self, conn: sa.Connection, statement: str) -> None:
        """Nothing is left half-built: SQLite has no concurrent index builds."""

    def in_transaction(self, statement: str) -> str:
        """Every SQLite statement runs in a transaction as it is."""
        return statement

    def version_shapes(self, conn: sa.Connection, steps: Sequence[Step]) -> list[dict[str, TableShape | None]]:
        """Version 1 only (the later steps say ``IF NOT EXISTS``), in a throwaway in-memory
        database."""
        scratch = sa.create_engine("sqlite://")
        try:
            with scratch.begin() as private:
                for statement in steps[0].statements:
                    execute(private, statement)
                return [reflect_shape(private)]
        finally:
            scratch.dispose()


class MySqlBackend:
    """A named lock (``GET_LOCK``) per database; every step in a transaction (InnoDB commits
    each DDL statement on its own, so a step interrupted halfway is finished by hand); the
    versions built one after the other in a scratch database, dropped after."""

    name = "mysql"
    #: The lock's name, per database: MySQL refuses names over 64 characters and a database's
    #: name may have 64 itself, so the name carries its MD5 (43 characters in all).
    LOCK_NAME = "CONCAT('dt_migrate:', MD5(DATABASE()))"

    def lock(self, conn: sa.Connection, on_wait: Callable[[], None] | None) -> bool:
        """The session's named lock, held across the steps' transactions until :meth:`unlock`."""
        waited = False
        while not conn.exec_driver_sql(f"SELECT GET_LOCK({self.LOCK_NAME}, 1)").scalar():
            if not waited and on_wait is not None:
                on_wait()
            waited = True
        conn.commit()
        return waited

    def unlock(self, conn: sa.Connection) -> None:
        """Release the named lock."""
        conn.exec_driver_sql(f"SELECT RELEASE_LOCK({self.LOCK_NAME})")
        conn.commit()

    def lock_in_transaction(self, conn: sa.Connection) -> None:
        """The named lock (MySQL has no transaction-scoped one): held until the connection
        closes, as Alembic's does after its revisions, or until another :meth:`unlock`."""
        while not conn.exec_driver_sql(f"SELECT GET_LOCK({self.LOCK_NAME}, 1)").scalar():
            pass

    def before_outside_transaction(self, conn: sa.Connection, statement: str) -> None:
        """Nothing is left half-built: InnoDB builds an index or fails whole."""

    def in_transaction(self, statement: str) -> str:
        """Every MySQL statement runs as it is."""
        return statement

    def version_shapes(self, conn: sa.Connection, steps: Sequence[Step]) -> list[dict[str, TableShape | None]]:
        """The shape after each step: MySQL's DDL has no ``IF NOT EXISTS`` for columns and
        indexes, so tables that ``create_all`` made before versions are adopted at the version
        they match, whichever that is."""
        scratch = f"dt_scratch_{uuid.uuid4().hex[:12]}"
        try:
            conn.exec_driver_sql(f"CREATE DATABASE `{scratch}` CHARACTER SET utf8mb4")
        except sa.exc.DBAPIError as exc:
            raise MigrationError(
                "adopting tables made before versioning builds each version in a scratch database, and this "
                f"user cannot create one ({exc.orig}): run `durable-tasks migrate` once as a user that can"
            ) from exc
        engine = sa.create_engine(conn.engine.url.set(database=scratch), poolclass=sa.pool.NullPool)
        shapes: list[dict[str, TableShape | None]] = []
        try:
            with engine.connect() as private:
                for step in steps:
                    for statement in step.statements:
                        execute(private, statement)
                    private.commit()
                    shapes.append(reflect_shape(private))
        finally:
            engine.dispose()
            conn.exec_driver_sql(f"DROP DATABASE `{scratch}`")
        return shapes


def backend_for(dialect: sa.Dialect) -> Backend:
    """The backend of a dialect; an unsupported one is a configuration error."""
    if dialect.name == "postgresql":
        return PostgresBackend()
    if dialect.name == "sqlite":
        return SqliteBackend()
    if dialect.name in ("mysql", "mariadb"):
        return MySqlBackend()
    raise ConfigurationError(
        f"durable_tasks has no migrations for {dialect.name!r} databases; supported: {', '.join(sorted(BACKENDS))}"
    )
