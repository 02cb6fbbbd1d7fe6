"""Fixtures for tests that need databases of their own, empty (schema migrations)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa


@pytest.fixture(params=["sqlite", "postgres"])
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of empty databases on the test's backend: SQLite files, or PostgreSQL
    schemas of their own (dropped after the test)."""
    made: list[str] = []
    admin: sa.Engine | None = None
    base: sa.URL | None = None
    if request.param == "postgres":
        base = sa.make_url(request.getfixturevalue("postgres_url"))
        base = base.difference_update_query(["options"])
        admin = sa.create_engine(base)

    files = iter(range(1_000))

    def make() -> str:
        if admin is None or base is None:
            return f"sqlite:///{tmp_path / f'db{next(files)}.sqlite3'}"
        schema = f"dt_mig_{uuid.uuid4().hex[:10]}"
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        made.append(schema)
        return base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)

    yield make
    if admin is not None:
        with admin.begin() as conn:
            for schema in made:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
