"""The runtime's tables in a database: creating them, and finding the indexes an older
database lacks (``durable-tasks doctor`` prints the statements that add them)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlmodel import SQLModel

from ..records import attempts_table, outbox_table, steps_table, tasks_table

__all__ = ["create_all", "made_on", "missing_indexes"]


def create_all(engine: sa.Engine, tables: Sequence[sa.Table]) -> None:
    """Create ``tables`` where they do not exist."""
    SQLModel.metadata.create_all(engine, tables=list(tables))


def missing_indexes(engine: sa.Engine) -> list[str]:
    """The CREATE INDEX statements of the runtime's indexes that the database lacks (tables
    that do not exist at all are left to ``init-db``)."""
    inspector = sa.inspect(engine)
    statements = []
    for table in (tasks_table, outbox_table, attempts_table, steps_table):
        if not inspector.has_table(table.name):
            continue
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if index.name not in present and made_on(index, engine.dialect):
                statements.append(str(sa.schema.CreateIndex(index).compile(dialect=engine.dialect)).strip())
    return statements


def made_on(index: sa.Index, dialect: sa.Dialect) -> bool:
    """Whether ``index`` exists on this dialect (``Index(...).ddl_if(dialect=...)``): the
    models declare a few indexes per dialect (a partial index, or MySQL's range instead)."""
    condition = getattr(index, "_ddl_if", None)
    if condition is None or condition.dialect is None:
        return True
    names = condition.dialect if isinstance(condition.dialect, tuple | list | set) else (condition.dialect,)
    return dialect.name in names
