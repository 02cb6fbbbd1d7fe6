"""Outages as the library's errors: what the App raises when a server cannot be reached.

The loops treat SQLAlchemy's and redis' errors as "try again later"; at the App's public
calls they become :class:`~durable_tasks.errors.DatabaseUnavailableError` or
:class:`~durable_tasks.errors.BrokerUnavailableError`, each saying what to do, never with a
password.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from sqlalchemy.exc import SQLAlchemyError

from .errors import BrokerUnavailableError, DatabaseUnavailableError
from .urls import safe_url

__all__ = ["UNREACHABLE", "broker_errors", "database_error", "database_errors", "is_permanent"]

#: Errors that mean the database could not be reached (the others: it refused a statement).
UNREACHABLE = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, sa.exc.TimeoutError)

#: What a server says when waiting cannot help: the database or the role is not there, the
#: password is wrong (PostgreSQL's FATAL lines; MySQL's codes 1044, 1045, 1049, 1698).
_PERMANENT_TEXT = re.compile(
    r'database "[^"]*" does not exist|role "[^"]*" does not exist|password authentication failed'
    r"|no password supplied|Unknown database|Access denied for user"
)
_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]*)" does not exist|Unknown database \'(?P<mysql>[^\']*)\'')


def is_permanent(exc: BaseException) -> bool:
    """Whether ``exc`` (a DatabaseUnavailableError, BrokerUnavailableError or what they wrap)
    says something no retry can change: a database that does not exist, a refused login. A
    starting process gives up at once on these instead of waiting out ``startup_wait``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, AuthenticationError) or _PERMANENT_TEXT.search(str(seen)):
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False


#: A transaction the server rolled back to end a conflict, not an outage: PostgreSQL's deadlock
#: and serialization failure (SQLSTATE), MySQL's deadlock (error code; InnoDB rolls the whole
#: transaction back).
_ROLLED_BACK = frozenset({"40P01", "40001", 1213})
#: A statement the server stopped, its transaction left to the caller: a lock not had in time
#: (PostgreSQL's lock_timeout or NOWAIT, InnoDB's innodb_lock_wait_timeout) or a statement
#: timeout (PostgreSQL's statement_timeout, MySQL's max_execution_time, MariaDB's
#: max_statement_time).
_STOPPED = frozenset({"55P03", "57014", 1205, 3024, 1969})


def _code(cause: BaseException) -> object:
    """The server's code for ``cause``: PyMySQL's error number (its errors are ``(number,
    message)``; their ``sqlstate`` is often the generic HY000), else psycopg's SQLSTATE."""
    args: tuple[object, ...] = getattr(cause, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return getattr(cause, "sqlstate", None)


def database_error(exc: SQLAlchemyError, engine: sa.Engine) -> DatabaseUnavailableError:
    """What to do about a database error, in one line (the driver's reason, without the SQL)."""
    url = safe_url(engine.url.render_as_string(hide_password=False))
    cause = getattr(exc, "orig", None) or exc
    reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    # SQLite reports a missing table as an OperationalError, as it reports an unreadable file.
    missing = _MISSING_DATABASE.search(reason)
    if missing is not None:
        name = missing["name"] or missing["mysql"]
        return DatabaseUnavailableError(
            f"the database {name!r} does not exist on the server of {url}: create it "
            f"(CREATE DATABASE {name}), or point DT_DATABASE_URL at one that exists."
        )
    code = _code(cause)
    if code in _ROLLED_BACK:
        return DatabaseUnavailableError(
            f"the database at {url} rolled the transaction back to let another go on: {reason}. "
            "Nothing of it was written; run it again."
        )
    if code in _STOPPED:
        return DatabaseUnavailableError(
            f"the database at {url} stopped a statement that waited or ran too long: {reason}. "
            "Roll the transaction back and run it again, or give it more time (the server's lock "
            "or statement timeout)."
        )
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
    except AuthenticationError as exc:
        raise BrokerUnavailableError(
            f"Redis at {safe_url(redis_url())} refused the login: {str(exc).rstrip('.')}. "
            "Check the user and password in DT_REDIS_URL."
        ) from exc
    except (RedisError, RedisClusterException, OSError) as exc:
        raise BrokerUnavailableError(
            f"cannot reach Redis at {safe_url(redis_url())}: {str(exc).rstrip('.')}. "
            "Start it, or point DT_REDIS_URL at one."
        ) from exc
