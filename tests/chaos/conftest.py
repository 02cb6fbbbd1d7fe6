"""The chaos tests' own PostgreSQL: started once per module (or borrowed from
``DT_CHAOS_DATABASE_URL``), one fresh schema per scenario."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Postgres


@pytest.fixture(scope="module")
def chaos_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    postgres = Postgres.start(tmp_path_factory.mktemp("chaos-postgres"))
    try:
        yield postgres
    finally:
        postgres.close()
