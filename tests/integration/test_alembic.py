"""Applications that run Alembic: a revision applies durable_tasks' steps with
``migrations.upgrade(op, to=N)``, and autogenerate, with ``include_name``/``include_object``,
neither creates nor drops the runtime's tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from durable_tasks.migrations import include_name, include_object, read_status, steps_for
from tests.apps.alembic_project.models import metadata

PROJECT = Path(__file__).resolve().parents[1] / "apps" / "alembic_project"


def test_a_revision_applies_durable_tasks_steps_and_autogenerate_leaves_them_alone(
    new_database: Callable[[], str],
) -> None:
    url = new_database()
    config = Config()
    config.set_main_option("script_location", str(PROJECT))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(config, "head")

    engine = sa.create_engine(url)
    with engine.connect() as conn:
        status = read_status(conn)
        assert status.version == 3
        assert [s.version for s in status.pending] == [s.version for s in steps_for(conn.dialect)][3:]
        assert sa.inspect(conn).has_table("submissions")
        filtered = MigrationContext.configure(
            conn, opts={"include_name": include_name, "include_object": include_object}
        )
        assert compare_metadata(filtered, metadata) == []
        unfiltered = compare_metadata(MigrationContext.configure(conn), metadata)
        dropped = {diff[1].name for diff in unfiltered if diff[0] == "remove_table"}
        assert {"dt_tasks", "dt_outbox", "dt_migrations"} <= dropped  # what the hooks spare the application
    command.upgrade(config, "head")  # nothing left to do: no error, no change
    with engine.connect() as conn:
        assert read_status(conn).version == 3
    engine.dispose()
