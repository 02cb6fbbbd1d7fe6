"""The shape of the runtime's tables, comparable across sources: a database (by reflection) or
the models (:data:`durable_tasks.records.metadata`), per dialect.

A shape holds what the runtime depends on: columns with their type as the dialect spells it
and their nullability, the primary key, indexes (columns, uniqueness, partial predicate), unique
constraints and the storage parameters the models set (PostgreSQL's ``WITH (fillfactor = 50)``;
others an operator set, an autovacuum setting say, are the operator's and not compared).
:func:`differences` names each way one shape departs from another in a line an operator can act
on; ``doctor`` reports them as drift, and the tests use them to prove that the migrations make
exactly what the models declare.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ..records import metadata
from ..store.schema import made_on

__all__ = ["TableShape", "differences", "is_extra", "is_storage", "model_shape", "reflect_shape", "runtime_tables"]

#: What a line of :func:`differences` is about, read where the lines are written: something the
#: models lack (an operator's own table, column, index or unique constraint, which the runtime
#: never reads), and a storage parameter the models set (a table's speed, not its statements).
_EXTRA = re.compile(r"(^|: )extra ")
_STORAGE = ": storage parameter "


@dataclass(frozen=True, slots=True)
class Index:
    """One index: its columns in order, whether it is unique, its normalized predicate."""

    columns: tuple[str, ...]
    unique: bool
    where: str | None

    def describe(self) -> str:
        """``(a, b) unique where state='pending'``."""
        text = f"({', '.join(self.columns)})" + (" unique" if self.unique else "")
        return text + (f" where {self.where}" if self.where else "")


@dataclass(frozen=True, slots=True)
class TableShape:
    """One table as the runtime relies on it."""

    columns: dict[str, tuple[str, bool]] = field(default_factory=dict)  # name -> (type, nullable)
    primary_key: tuple[str, ...] = ()
    indexes: dict[str, Index] = field(default_factory=dict)
    uniques: dict[str, tuple[str, ...]] = field(default_factory=dict)
    storage: dict[str, str] = field(default_factory=dict)  # storage parameter -> value, as text


def _storage(options: dict[str, Any] | None) -> dict[str, str]:
    """Storage parameters with their values as text, as PostgreSQL reflects them."""
    return {name: str(value) for name, value in (options or {}).items()}


def runtime_tables() -> list[str]:
    """The names of the runtime's tables, in creation order."""
    return [table.name for table in metadata.sorted_tables]


def _where(text: Any) -> str | None:
    """A partial index predicate, normalized so that reflection and models compare equal:
    PostgreSQL reflects ``((state)::text = 'PENDING'::text)`` for ``state = 'PENDING'``."""
    if text is None:
        return None
    return re.sub(r"::[a-z ]+|[()\s\"]", "", str(text)).lower() or None


#: MySQL reflects display widths the DDL never gave (``INTEGER(11)``) and BOOL as TINYINT(1).
_SPELLINGS = ((re.compile(r"^(INTEGER|BIGINT|SMALLINT)\(\d+\)"), r"\1"), (re.compile(r"^TINYINT\(1\)"), "BOOL"))


def _type(type_: sa.types.TypeEngine[Any], dialect: sa.Dialect) -> str:
    spelled = str(type_.compile(dialect=dialect)).upper()
    for pattern, replacement in _SPELLINGS:
        spelled = pattern.sub(replacement, spelled)
    return spelled


def reflect_shape(
    bind: sa.Connection | sa.Engine, tables: Iterable[str] | None = None, *, schema: str | None = None
) -> dict[str, TableShape | None]:
    """The shape of each runtime table in the database (None for a table that is absent)."""
    inspector = sa.inspect(bind)
    dialect = bind.dialect
    found: dict[str, TableShape | None] = {}
    for name in tables if tables is not None else runtime_tables():
        if not inspector.has_table(name, schema=schema):
            found[name] = None
            continue
        columns = {
            c["name"]: (_type(c["type"], dialect), bool(c["nullable"]))
            for c in inspector.get_columns(name, schema=schema)
        }
        uniques = {
            str(uq["name"]): tuple(uq["column_names"]) for uq in inspector.get_unique_constraints(name, schema=schema)
        }
        indexes = {
            str(ix["name"]): Index(
                tuple(str(c) for c in ix["column_names"]),
                bool(ix["unique"]),
                _where(next((v for k, v in ix.get("dialect_options", {}).items() if k.endswith("_where")), None)),
            )
            for ix in inspector.get_indexes(name, schema=schema)
            # MySQL lists a unique constraint among the indexes too, without saying so
            if not ix.get("duplicates_constraint") and ix["name"] not in uniques
        }
        pk = tuple(inspector.get_pk_constraint(name, schema=schema)["constrained_columns"])
        storage = _storage(inspector.get_table_options(name, schema=schema).get(f"{dialect.name}_with"))
        found[name] = TableShape(columns, pk, indexes, uniques, storage)
    return found


def model_shape(dialect: sa.Dialect, tables: sa.MetaData = metadata) -> dict[str, TableShape]:
    """The shape the models declare (or other ``tables``), as ``dialect`` would create it."""
    shapes: dict[str, TableShape] = {}
    for table in tables.sorted_tables:
        columns = {c.name: (_type(c.type, dialect), bool(c.nullable)) for c in table.columns}
        indexes = {
            str(ix.name): Index(
                tuple(c.name for c in ix.columns),
                bool(ix.unique),
                _where(ix.dialect_options[dialect.name].get("where")),  # None where the dialect has no partial index
            )
            for ix in table.indexes
            if made_on(ix, dialect)
        }
        uniques = {
            str(c.name): tuple(col.name for col in c.columns)
            for c in table.constraints
            if isinstance(c, sa.UniqueConstraint)
        }
        pk = tuple(c.name for c in table.primary_key.columns)
        storage = _storage(table.dialect_options[dialect.name].get("with"))
        shapes[table.name] = TableShape(columns, pk, indexes, uniques, storage)
    return shapes


def is_extra(line: str) -> bool:
    """Whether a line of :func:`differences` names something the models do not have."""
    return _EXTRA.search(line) is not None


def is_storage(line: str) -> bool:
    """Whether a line of :func:`differences` names a storage parameter the models set."""
    return _STORAGE in line


def differences(
    actual: dict[str, TableShape | None], expected: dict[str, TableShape] | dict[str, TableShape | None]
) -> list[str]:
    """How ``actual`` departs from ``expected``, one line each (empty: they match)."""
    lines: list[str] = []
    for name, want in expected.items():
        have = actual.get(name)
        if want is None:
            if have is not None:
                lines.append(f"extra table {name}")
            continue
        if have is None:
            lines.append(f"missing table {name}")
            continue
        lines += _table_differences(name, have, want)
    return lines


def _table_differences(name: str, have: TableShape, want: TableShape) -> list[str]:
    lines: list[str] = []
    for column, (type_, nullable) in want.columns.items():
        spelled = f"{type_}{'' if nullable else ' NOT NULL'}"
        if column not in have.columns:
            lines.append(f"{name}: missing column {column} {spelled}")
        elif have.columns[column] != (type_, nullable):
            got_type, got_null = have.columns[column]
            lines.append(f"{name}.{column}: {got_type}{'' if got_null else ' NOT NULL'}, expected {spelled}")
    lines += [f"{name}: extra column {c}" for c in have.columns if c not in want.columns]
    if have.primary_key != want.primary_key:
        lines.append(f"{name}: primary key ({', '.join(have.primary_key)}), expected ({', '.join(want.primary_key)})")
    for kind, have_map, want_map in (
        ("index", have.indexes, want.indexes),
        ("unique constraint", have.uniques, want.uniques),
    ):
        for ix_name, ix in want_map.items():
            shown = ix.describe() if isinstance(ix, Index) else f"({', '.join(ix)})"
            if ix_name not in have_map:
                lines.append(f"{name}: missing {kind} {ix_name} {shown}")
            elif have_map[ix_name] != ix:
                got = have_map[ix_name]
                got_shown = got.describe() if isinstance(got, Index) else f"({', '.join(got)})"
                lines.append(f"{name}: {kind} {ix_name} is {got_shown}, expected {shown}")
        lines += [f"{name}: extra {kind} {n}" for n in have_map if n not in want_map]
    unlike = {key: value for key, value in want.storage.items() if have.storage.get(key) != value}
    if unlike:  # not a step to run (the version says it ran): the statement that puts it right
        found = ", ".join(f"{key}={have.storage.get(key, 'unset')}" for key in unlike)
        expected = ", ".join(f"{key}={value}" for key, value in unlike.items())
        lines.append(f"{name}{_STORAGE}{found}, expected {expected}: ALTER TABLE {name} SET ({expected})")
    return lines
