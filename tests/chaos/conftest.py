"""The chaos tests' own PostgreSQL: started once per module (or borrowed from
``DT_CHAOS_DATABASE_URL``), one fresh schema per scenario; and the machine's MySQL/MariaDB
(``DT_TEST_MYSQL_URL``), one fresh database per scenario."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.servers import server_home

from .harness import Postgres
from .mysql import MySql


@pytest.fixture(scope="module")
def chaos_postgres() -> Iterator[Postgres]:
    with server_home("chaos-postgres") as home:
        postgres = Postgres.start(home)
        try:
            yield postgres
        finally:
            postgres.close()


@pytest.fixture(scope="module")
def chaos_mysql() -> Iterator[MySql]:
    try:
        mysql = MySql.start()
    except (ImportError, sa.exc.DBAPIError) as exc:
        pytest.skip(f"no MySQL/MariaDB server answers for the chaos runs ({exc}); set DT_TEST_MYSQL_URL")
    try:
        yield mysql
    finally:
        mysql.close()
