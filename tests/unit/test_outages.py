"""Which failures a starting process waits out, and how a missing database is named."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from durable_tasks.errors import BrokerUnavailableError, DatabaseUnavailableError
from durable_tasks.outages import broker_errors, database_error, is_permanent
from durable_tasks.settings import Settings

ENGINE = sa.create_engine("postgresql+psycopg://app:s3cret@db:5432/shop")


def operational(message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, Exception(message))


@pytest.mark.parametrize(
    ("message", "permanent"),
    [
        ('connection failed: FATAL:  database "shop" does not exist', True),
        ('connection failed: FATAL:  password authentication failed for user "app"', True),
        ('connection failed: FATAL:  role "app" does not exist', True),
        ("(1049, \"Unknown database 'shop'\")", True),
        ("(1045, \"Access denied for user 'app'@'10.0.0.1'\")", True),
        ("connection failed: Connection refused", False),
        ("connection failed: FATAL:  the database system is starting up", False),
    ],
)
def test_only_what_waiting_cannot_change_is_permanent(message: str, permanent: bool) -> None:
    cause = operational(message)
    with pytest.raises(DatabaseUnavailableError) as raised:
        raise database_error(cause, ENGINE) from cause
    assert is_permanent(raised.value) is permanent


def test_a_missing_database_is_named_with_what_to_do_and_no_password() -> None:
    error = database_error(operational('connection failed: FATAL:  database "shop" does not exist'), ENGINE)
    assert "the database 'shop' does not exist" in str(error)
    assert "CREATE DATABASE shop" in str(error)
    assert "s3cret" not in str(error)


def test_a_transaction_rolled_back_for_a_deadlock_says_to_run_it_again_not_to_start_the_database() -> None:
    class DeadlockDetected(Exception):  # as psycopg's: its SQLSTATE on the exception
        sqlstate = "40P01"

    mysql = Exception(1213, "Deadlock found when trying to get lock")  # as PyMySQL's: (code, message)
    for cause in (DeadlockDetected("deadlock detected"), mysql):
        error = database_error(sa.exc.OperationalError("INSERT", {}, cause), ENGINE)
        assert "rolled the transaction back" in str(error)
        assert "run it again" in str(error)
        assert "Start it" not in str(error)
        assert not is_permanent(error)
    assert "Start it" in str(database_error(operational("connection failed: Connection refused"), ENGINE))


def test_a_statement_the_server_stopped_says_to_roll_back_and_retry_not_to_start_the_database() -> None:
    class QueryCanceled(Exception):  # as psycopg's, for statement_timeout
        sqlstate = "57014"

    mysql = Exception(1205, "Lock wait timeout exceeded; try restarting transaction")
    mysql.sqlstate = "HY000"  # type: ignore[attr-defined]  # as PyMySQL sets it for this error
    for cause in (QueryCanceled("canceling statement due to statement timeout"), mysql):
        error = database_error(sa.exc.OperationalError("UPDATE", {}, cause), ENGINE)
        assert "stopped a statement" in str(error)
        assert "Roll the transaction back and run it again" in str(error)
        assert "Start it" not in str(error)
        assert "s3cret" not in str(error)


def test_a_refused_redis_login_is_permanent_and_a_refused_connection_is_not() -> None:
    def raised(exc: Exception) -> BrokerUnavailableError:
        with pytest.raises(BrokerUnavailableError) as info, broker_errors(lambda: "redis://:pw@r:6379/0"):
            raise exc
        return info.value

    login = raised(AuthenticationError("invalid username-password pair"))
    assert is_permanent(login)
    assert "refused the login" in str(login)
    assert not is_permanent(raised(RedisConnectionError("Error 111 connecting to r:6379")))


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("postgres://app:pw@db/shop", "postgresql://app:pw@db/shop"),
        ("postgres+psycopg://db/shop", "postgresql+psycopg://db/shop"),
        ("postgresql://db/shop", "postgresql://db/shop"),
        ("sqlite:///postgres.db", "sqlite:///postgres.db"),
    ],
)
def test_postgres_urls_are_read_as_postgresql(given: str, read: str) -> None:
    settings = Settings(database_url=given, listen_database_url=given)
    assert (settings.database_url, settings.listen_database_url) == (read, read)
