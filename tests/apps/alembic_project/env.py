"""Alembic's env.py of an application that also runs durable_tasks: its own tables on its own
metadata, durable_tasks' tables applied by a revision and left out of autogenerate."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from durable_tasks.migrations import include_name, include_object
from tests.apps.alembic_project.models import metadata


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            include_name=include_name,  # durable_tasks' tables are not the application's
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
