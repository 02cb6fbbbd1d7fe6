"""Versioned, forward-only migrations of the tables durable_tasks owns in your database.

Each backend (``postgres/``, ``sqlite/``, ``mysql/``) ships numbered SQL files, ``NNNN_<name>.sql``; the
database records every applied step in ``dt_migrations``. ``durable-tasks migrate`` applies
what is missing (``--sql`` prints it instead, ``--check`` exits 1 while steps are missing);
``durable-tasks init-db`` and ``App.create_all()`` migrate to the latest. On PostgreSQL,
migrators take an advisory lock (MySQL: ``GET_LOCK``), so two deploys migrating at once run one
after the other. Every
runtime process checks the version as it starts (:func:`check_schema`): a schema older than
the code needs stops it with exit code 2 and the command that fixes it.

Adding step N (one file per backend; the number and the name agree across backends):

1. ``postgres/000N_<name>.sql``, ``sqlite/000N_<name>.sql`` and ``mysql/000N_<name>.sql`` hold
   the statements, each ended by ``;`` (a backend with nothing to do gets a file of comments;
   MySQL has no ``IF NOT EXISTS`` for columns and indexes, and needs none: tables made before
   its versions are adopted at the version they match). The change to the models in
   ``durable_tasks/records.py`` goes in the same commit:
   ``tests/integration/test_migrations_match_models.py`` fails until models and migrations make
   the same tables, columns, types, nullability, indexes and unique constraints.
2. A step that older code survives (a new nullable column, a new table or index) is
   ``pre-deploy`` (the default). A step that older code cannot survive (dropping or renaming
   what it reads, a new NOT NULL without a default) is split: a pre-deploy step that adds, and
   a later ``-- phase: post-deploy`` step that contracts, applied once no older process runs
   (docs/upgrading.md says the order). The code needs its last pre-deploy step; a post-deploy
   step tells older code it can no longer run.
3. An index on a big PostgreSQL table: ``CREATE INDEX CONCURRENTLY IF NOT EXISTS ...`` in a file
   whose header says ``-- transaction: none``; the runner drops an invalid leftover of an
   interrupted build first.

Version 1 is the schema ``create_all()`` made before versioning, so a database made by that code
is recorded as version 1 (after checking it matches) instead of being rebuilt.

For applications that run Alembic: :func:`upgrade` (``upgrade(op, to=N)`` in a revision) and
:func:`include_object` / :func:`include_name` for ``env.py``.
"""

from __future__ import annotations

from .alembic_support import include_name, include_object, is_runtime_table, upgrade
from .check import SchemaReport, check_schema, schema_report
from .runner import VERSION_TABLE, MigrationReport, SchemaStatus, migrate, read_status, render_sql, steps_for
from .schema import differences, model_shape, reflect_shape, runtime_tables
from .steps import BACKENDS, Phase, Step

__all__ = [
    "VERSION_TABLE",
    "MigrationReport",
    "Phase",
    "SchemaReport",
    "SchemaStatus",
    "Step",
    "check_schema",
    "differences",
    "include_name",
    "include_object",
    "is_runtime_table",
    "migrate",
    "model_shape",
    "read_status",
    "reflect_shape",
    "render_sql",
    "runtime_tables",
    "schema_report",
    "steps_for",
    "supports",
    "upgrade",
]


def supports(dialect: object) -> bool:
    """Whether durable_tasks ships migration steps for this database (a SQLAlchemy dialect)."""
    return getattr(dialect, "name", None) in BACKENDS
