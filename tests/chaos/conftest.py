"""The chaos tests' own PostgreSQL: started once per module (or borrowed from
``DT_CHAOS_DATABASE_URL``), one fresh schema per scenario."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import server_home

from .harness import Postgres


@pytest.fixture(scope="module")
def chaos_postgres() -> Iterator[Postgres]:
    with server_home("chaos-postgres") as home:
        postgres = Postgres.start(home)
        try:
            yield postgres
        finally:
            postgres.close()
