"""Choosing the store: once, where the App builds its engine, from the database URL."""

from __future__ import annotations

import sqlalchemy as sa

from ..errors import ConfigurationError
from ..settings import Settings
from .mysql import MySqlStore
from .postgres import PostgresStore
from .protocol import Store
from .sqlite import SqliteStore

__all__ = ["open_store"]

#: The backends durable_tasks has a store for, by SQLAlchemy backend name.
SUPPORTED = ("postgresql", "sqlite", "mysql", "mariadb")


def open_store(settings: Settings) -> Store:
    """The store for ``settings.database_url``, or a SQLite file in ``settings.data_dir`` when
    it is None.

    Raises :class:`~durable_tasks.errors.ConfigurationError` for a URL that is not one, or that
    names a database durable_tasks has no store for.
    """
    if settings.database_url is None:
        return SqliteStore.in_directory(settings.data_dir)
    try:
        url = sa.make_url(settings.database_url)
    except sa.exc.ArgumentError as exc:
        raise ConfigurationError(f"DT_DATABASE_URL is not a database URL: {exc}") from exc
    backend = url.get_backend_name()
    if backend == "postgresql":
        return PostgresStore.open(url, settings)
    if backend == "sqlite":
        return SqliteStore.open(url)
    if backend in ("mysql", "mariadb"):
        return MySqlStore.open(url, settings)
    raise ConfigurationError(
        f"durable_tasks has no store for {backend!r} databases; use one of {', '.join(SUPPORTED)} "
        "(e.g. postgresql+psycopg://user@host/db)"
    )
