"""The schema check every runtime process makes as it starts (one read of the version table),
and the fuller report ``doctor`` prints."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import sqlalchemy as sa

from ..errors import SchemaError, SchemaMissingError, SchemaOutdatedError, SchemaTooNewError
from .runner import SchemaStatus, read_status
from .schema import differences, model_shape, reflect_shape

__all__ = ["SchemaReport", "check_schema", "schema_report"]

logger = logging.getLogger(__name__)


def check_schema(engine: sa.Engine) -> SchemaStatus:
    """Raise if this code cannot run on the database's schema: none at all
    (:class:`SchemaMissingError`), older than this code needs (:class:`SchemaOutdatedError`),
    or contracted by a newer release for code this one is older than
    (:class:`SchemaTooNewError`). A newer schema this code can run on is logged as a warning.
    Returns the status."""
    with engine.connect() as conn:
        status = read_status(conn)
    where = engine.url.render_as_string(hide_password=True)
    if not status.version and not status.has_tables:
        raise SchemaMissingError(
            f"the database at {where} has no durable_tasks tables: run `durable-tasks init-db` (or App.create_all())"
        )
    if not status.version:
        raise SchemaOutdatedError(
            f"the durable_tasks tables at {where} predate schema versioning: run `durable-tasks migrate` "
            f"(brings them to version {status.latest}, keeping every row)"
        )
    if status.version < status.required:
        raise SchemaOutdatedError(
            f"the durable_tasks schema at {where} is at version {status.version}; this code needs version "
            f"{status.required}: run `durable-tasks migrate`"
        )
    if status.version > status.latest:
        if status.floor > status.latest:
            raise SchemaTooNewError(
                f"the durable_tasks schema at {where} is at version {status.version}, changed for code that knows "
                f"version {status.floor} or later; this code knows {status.latest}: deploy the newer release"
            )
        logger.warning(
            "the durable_tasks schema is at version %d, newer than this code's %d; its changes keep older code "
            "running, so this process runs",
            status.version,
            status.latest,
        )
    return status


@dataclass(frozen=True, slots=True)
class SchemaReport:
    """What ``doctor`` says about the schema: its version line, why the runtime would refuse to
    start (None: it starts), whether it is newer than this code, and its drift from the models
    (missing or extra columns, indexes, unique constraints; compared at this code's latest
    version only, where migrations and models must agree)."""

    status: str
    problem: str | None
    newer: bool
    drift: list[str] = field(default_factory=list)


def schema_report(engine: sa.Engine) -> SchemaReport:
    """Read the schema's version and compare its tables with the models."""
    try:
        status = check_schema(engine)
    except SchemaError as exc:
        return SchemaReport(_status_line(engine), str(exc), isinstance(exc, SchemaTooNewError))
    drift: list[str] = []
    if status.version == status.latest:
        drift = differences(reflect_shape(engine), model_shape(engine.dialect))
    return SchemaReport(status.describe(), None, (status.version or 0) > status.latest, drift)


def _status_line(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return read_status(conn).describe()
