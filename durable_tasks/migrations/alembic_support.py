"""For applications that run their own Alembic migrations: apply durable_tasks' steps from an
Alembic revision, and keep the runtime's tables out of autogenerate."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import sqlalchemy as sa

from ..records import metadata
from .backends import backend_for
from .runner import VERSION_TABLE, _target, apply_steps, read_status, versions
from .steps import Step

__all__ = ["include_name", "include_object", "is_runtime_table", "upgrade"]


class Operations(Protocol):
    """What :func:`upgrade` uses of ``alembic.op``."""

    def get_bind(self) -> sa.Connection: ...

    def get_context(self) -> Any: ...


def upgrade(op: Operations, to: int | None = None) -> list[Step]:
    """Bring durable_tasks' tables to version ``to`` (default: the latest this code ships)
    inside the running Alembic revision's transaction; returns the steps applied.

    Pin ``to`` in each revision (``upgrade(op, to=2)``), as Oban's migrations do, so that a
    revision written today does the same thing after a later durable_tasks upgrade; a newer
    durable_tasks then gets a new revision with a higher ``to``. Steps that must run outside a
    transaction use Alembic's ``autocommit_block``. Migrations only go forward: a downgrade
    leaves the runtime's tables as they are.
    """
    conn = op.get_bind()
    backend = backend_for(conn.dialect)
    backend.lock_in_transaction(conn)
    versions.create(conn, checkfirst=True)
    status = read_status(conn)
    return apply_steps(
        conn,
        backend,
        status,
        _target(status, to, False),
        transaction=contextlib.nullcontext,
        outside=op.get_context().autocommit_block,
    )


def is_runtime_table(name: str | None) -> bool:
    """Whether ``name`` is one of durable_tasks' tables (the version table included)."""
    return name == VERSION_TABLE or name in metadata.tables


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic's ``include_name`` hook: skip durable_tasks' tables when reflecting."""
    return not (type_ == "table" and is_runtime_table(name))


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's ``include_object`` hook: leave durable_tasks' tables, and their columns,
    indexes and constraints, to durable_tasks (autogenerate would otherwise propose dropping
    them, since they are not on the application's metadata)."""
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return not (isinstance(table, sa.Table) and is_runtime_table(table.name))
