"""Outages as the library's errors: what the App raises when a server cannot be reached.

The loops treat SQLAlchemy's and redis' errors as "try again later"; at the App's public
calls they become :class:`~durable_tasks.errors.DatabaseUnavailableError` or
:class:`~durable_tasks.errors.BrokerUnavailableError`, each saying what to do, never with a
password.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from redis.exceptions import RedisClusterException, RedisError
from sqlalchemy.exc import SQLAlchemyError

from .errors import BrokerUnavailableError, DatabaseUnavailableError
from .urls import safe_url

__all__ = ["UNREACHABLE", "broker_errors", "database_error", "database_errors"]

#: Errors that mean the database could not be reached (the others: it refused a statement).
UNREACHABLE = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, sa.exc.TimeoutError)


def database_error(exc: SQLAlchemyError, engine: sa.Engine) -> DatabaseUnavailableError:
    """What to do about a database error, in one line (the driver's reason, without the SQL)."""
    url = safe_url(engine.url.render_as_string(hide_password=False))
    cause = getattr(exc, "orig", None) or exc
    reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    # SQLite reports a missing table as an OperationalError, as it reports an unreadable file.
    if isinstance(exc, UNREACHABLE) and "no such table" not in reason:
        return DatabaseUnavailableError(
            f"cannot reach the database at {url}: {reason}. Start it, or point DT_DATABASE_URL at one."
        )
    return DatabaseUnavailableError(
        f"the database at {url} refused a statement: {reason}. "
        "If the runtime's tables are missing, create them (durable-tasks init-db)."
    )


@contextmanager
def database_errors(engine: Callable[[], sa.Engine]) -> Iterator[None]:
    """SQLAlchemy's errors raised in the block as DatabaseUnavailableError."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise database_error(exc, engine()) from exc


@contextmanager
def broker_errors(redis_url: Callable[[], str]) -> Iterator[None]:
    """redis' (and socket) errors raised in the block as BrokerUnavailableError."""
    try:
        yield
    except (RedisError, RedisClusterException, OSError) as exc:
        raise BrokerUnavailableError(
            f"cannot reach Redis at {safe_url(redis_url())}: {exc}. Start it, or point DT_REDIS_URL at one."
        ) from exc
