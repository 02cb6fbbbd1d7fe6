"""The models and the migrations make the same tables, on every backend: a column, index or
constraint added to durable_tasks/records.py without a migration step (or the reverse) fails
here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from durable_tasks import App
from durable_tasks.doctor import Facts, Level, check_schema
from durable_tasks.migrations import differences, migrate, model_shape, reflect_shape, schema_report
from durable_tasks.records import metadata


def engine_for(url: str, tmp_path: Path) -> sa.Engine:
    """The engine the runtime would use (SQLite: its transactions take the write lock)."""
    return App(url, "redis://127.0.0.1:1/0", "models", data_dir=tmp_path).engine


def test_migrations_make_exactly_the_tables_the_models_declare(new_database: Callable[[], str], tmp_path: Path) -> None:
    from_models = engine_for(new_database(), tmp_path)
    from_migrations = engine_for(new_database(), tmp_path)
    try:
        metadata.create_all(from_models)
        migrate(from_migrations)
        made_by_models = reflect_shape(from_models)
        made_by_migrations = reflect_shape(from_migrations)
        assert all(made_by_models.values())
        assert differences(made_by_migrations, made_by_models) == []
        assert differences(made_by_models, made_by_migrations) == []  # extras, either way
        assert made_by_migrations == made_by_models  # columns, types, nullability, indexes, uniques
        assert differences(made_by_migrations, model_shape(from_migrations.dialect)) == []
    finally:
        from_models.dispose()
        from_migrations.dispose()


def test_a_column_added_to_the_models_without_a_step_is_caught(new_database: Callable[[], str], tmp_path: Path) -> None:
    engine = engine_for(new_database(), tmp_path)
    try:
        migrate(engine)
        grown = sa.MetaData()
        for table in metadata.sorted_tables:
            table.to_metadata(grown)
        grown.tables["dt_tasks"].append_column(sa.Column("weight", sa.Integer, nullable=False))
        sa.Index("ix_dt_tasks_weight", grown.tables["dt_tasks"].c.weight)
        found = differences(reflect_shape(engine), model_shape(engine.dialect, grown))
        assert "dt_tasks: missing column weight INTEGER NOT NULL" in found
        assert "dt_tasks: missing index ix_dt_tasks_weight (weight)" in found
    finally:
        engine.dispose()


def test_a_table_without_its_storage_parameters_is_drift(new_database: Callable[[], str], tmp_path: Path) -> None:
    """On PostgreSQL the migrations leave half of each page of dt_outbox and dt_attempts free
    (step 19, the models' ``postgresql_with``); a table without it is drift that ``doctor``
    warns of, naming the statement that puts it right. The other backends have no storage
    parameters to declare. A parameter the models do not set is the operator's, not drift."""
    app = App(new_database(), "redis://127.0.0.1:1/0", "models", data_dir=tmp_path)
    engine = app.engine
    try:
        migrate(engine)
        storage = {name: shape.storage for name, shape in reflect_shape(engine).items() if shape}
        if engine.dialect.name != "postgresql":
            assert list(storage.values()) == [{}] * len(storage)
            return
        hot = {"dt_outbox", "dt_attempts"}
        assert {name: s for name, s in storage.items() if s} == {table: {"fillfactor": "50"} for table in hot}
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE dt_outbox RESET (fillfactor)"))
            conn.execute(sa.text("ALTER TABLE dt_tasks SET (autovacuum_vacuum_scale_factor = 0.01)"))
        report = schema_report(engine)
        fix = "ALTER TABLE dt_outbox SET (fillfactor=50)"
        assert report.drift == [f"dt_outbox: storage parameter fillfactor=unset, expected fillfactor=50: {fix}"]
        now = datetime.now(UTC)
        finding = check_schema(Facts(app.settings, {}, {}, now, now, None, schema=report))
        assert (finding.level, fix in finding.message) == (Level.WARNING, True)  # its speed, not its statements
        with engine.begin() as conn:
            conn.exec_driver_sql(fix)
        assert schema_report(engine).drift == []
    finally:
        engine.dispose()
