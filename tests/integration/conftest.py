"""Fixtures of the integration tests: databases of their own, empty (schema migrations), and a
clock the tests move by hand."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from durable_tasks import App
from durable_tasks.clock import FrozenClock
from tests.helpers import FAST, delete_namespace_keys


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of empty databases on the test's backend: SQLite files, PostgreSQL schemas or
    MySQL/MariaDB databases of their own (dropped after the test)."""
    made: list[str] = []
    admin: sa.Engine | None = None
    base: sa.URL | None = None
    if request.param == "postgres":
        base = sa.make_url(request.getfixturevalue("postgres_url"))
        base = base.difference_update_query(["options"])
        admin = sa.create_engine(base)
    if request.param == "mysql":
        base = sa.make_url(request.getfixturevalue("mysql_url"))
        admin = sa.create_engine(base)

    files = iter(range(1_000))

    def make() -> str:
        if admin is None or base is None:
            return f"sqlite:///{tmp_path / f'db{next(files)}.sqlite3'}"
        name = f"dt_mig_{uuid.uuid4().hex[:10]}"
        if request.param == "mysql":
            with admin.begin() as conn:
                conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
            made.append(f"DATABASE `{name}`")
            return base.set(database=name).render_as_string(hide_password=False)
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{name}"'))
        made.append(f'SCHEMA "{name}" CASCADE')
        return base.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(hide_password=False)

    yield make
    if admin is not None:
        with admin.begin() as conn:
            for what in made:
                conn.execute(sa.text(f"DROP {what}"))
        admin.dispose()


@pytest.fixture
def clock() -> FrozenClock:
    """A clock that stands still until the test advances it (pass it as ``make_app(clock=...)``)."""
    return FrozenClock()


@pytest.fixture
def sqlite_app(tmp_path: Path, redis_url: str, namespace: str) -> Iterator[App]:
    """An App on a SQLite file of its own, schema made, fast timings: for what only SQLite
    shows (its planner) or what does not depend on the database (the attempts' own objects)."""
    built = App(f"sqlite:///{tmp_path / 'dt.sqlite3'}", redis_url, namespace, **FAST)
    built.create_all()
    yield built
    built.engine.dispose()
    delete_namespace_keys(redis_url, namespace)
