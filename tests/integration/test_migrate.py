"""``durable-tasks migrate`` and the schema check at start, on every backend: what each
command says and does, how a process meets a schema older or newer than its code, and how
pre-deploy and post-deploy steps order a deploy."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from durable_tasks import App, MigrationError, SchemaMissingError, SchemaOutdatedError, SchemaTooNewError
from durable_tasks.cli import cli
from durable_tasks.migrations import SchemaStatus, migrate, model_shape, read_status, runner
from durable_tasks.migrations.steps import Step, _parse, load_steps
from durable_tasks.records import outbox_table, tasks_table

APP = "tests.apps.cli_app:app"
SHIPPED = load_steps("sqlite")  # the same numbers and names on every backend
LATEST = SHIPPED[-1].version
REQUIRED = max(s.version for s in SHIPPED if s.phase.value == "pre-deploy")  # what this code needs


@pytest.fixture
def fresh_env(
    new_database: Callable[[], str], redis_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """``tests.apps.cli_app`` pointed at an empty database of its own; yields its URL."""
    url = new_database()
    for key, value in {
        "DT_DATABASE_URL": url,
        "DT_REDIS_URL": redis_url,
        "DT_NAMESPACE": namespace,
        "DT_DATA_DIR": str(tmp_path / "data"),
        "DT_STARTUP_WAIT": "0",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delitem(sys.modules, "tests.apps.cli_app", raising=False)
    yield url
    sys.modules.pop("tests.apps.cli_app", None)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def version_of(url: str) -> int | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return read_status(conn).version
    finally:
        engine.dispose()


def checked(app: App) -> SchemaStatus:
    status = app.check_schema()
    assert status is not None
    return status


def test_run_on_an_empty_database_exits_2_with_one_line_naming_init_db(fresh_env: str) -> None:
    code, out = invoke("run", APP)
    assert code == 2, out
    [line] = out.strip().splitlines()
    assert "has no durable_tasks tables: run `durable-tasks init-db`" in line
    assert "Traceback" not in out


def test_migrate_check_sql_to_and_forward_only(fresh_env: str) -> None:
    code, out = invoke("migrate", APP, "--check")
    assert code == 1, out
    missing = ", ".join(step.label for step in SHIPPED)
    assert f"missing {missing}; this code cannot start until they are applied" in out

    code, out = invoke("migrate", APP, "--sql")
    assert code == 0, out
    assert "CREATE TABLE dt_migrations" in out
    assert "CREATE TABLE dt_tasks" in out
    assert "INSERT INTO dt_migrations (version, name, phase, applied_at) VALUES (2, 'dt_submit'" in out
    assert version_of(fresh_env) is None  # a dry run

    code, out = invoke("migrate", APP, "--to", "1")
    assert (code, out) == (0, "applied 0001_baseline (pre-deploy)\nschema at version 1\n")
    code, out = invoke("run", APP)
    assert code == 2, out
    assert f"is at version 1; this code needs version {REQUIRED}: run `durable-tasks migrate`" in out

    code, out = invoke("migrate", APP)
    applied = "".join(f"applied {step.label} ({step.phase.value})\n" for step in SHIPPED[1:])
    assert (code, out) == (0, f"{applied}schema at version {LATEST}\n")
    assert invoke("migrate", APP) == (0, f"schema at version {LATEST}: nothing to do\n")
    code, out = invoke("migrate", APP, "--check")
    assert code == 0, out
    assert "up to date" in out
    code, out = invoke("migrate", APP, "--to", "1")
    assert code == 2, out
    assert "past 1; migrations only go forward" in out
    code, out = invoke("migrate", APP, "--to", "99")
    assert code == 2, out
    assert "there is no version 99" in out


def test_init_db_migrates_to_the_latest(fresh_env: str) -> None:
    code, out = invoke("init-db", APP)
    assert code == 0, out
    assert version_of(fresh_env) == LATEST


def test_tables_that_differ_from_version_1_are_named_not_adopted(fresh_env: str) -> None:
    engine = sa.create_engine(fresh_env)
    with engine.begin() as conn:  # the tables as version 1 makes them, without recording a version
        for statement in runner.steps_for(conn.dialect)[0].statements:
            conn.exec_driver_sql(statement)
        state_index = next(ix for ix in tasks_table.indexes if ix.name == "ix_dt_tasks_state")
        conn.execute(sa.schema.DropIndex(state_index))  # each dialect's spelling
    engine.dispose()
    code, out = invoke("migrate", APP)
    assert code == 2, out
    assert "differ from version 1: dt_tasks: missing index ix_dt_tasks_state (namespace, state, queue)" in out
    assert not version_of(fresh_env)


def test_the_start_check_names_what_to_run(new_database: Callable[[], str], tmp_path: Path) -> None:
    app = App(new_database(), "redis://127.0.0.1:1/0", "checks", data_dir=tmp_path)
    with pytest.raises(SchemaMissingError, match=r"run `durable-tasks init-db`"):
        app.check_schema()
    migrate(app.engine, to=1)
    outdated = rf"at version 1; this code needs version {REQUIRED}: run `durable-tasks migrate`"
    with pytest.raises(SchemaOutdatedError, match=outdated):
        app.check_schema()
    app.create_all()
    assert checked(app).version == LATEST
    app.engine.dispose()


def extra_steps(monkeypatch: pytest.MonkeyPatch, *steps: Step) -> None:
    """Ship ``steps`` after the real ones, as a later release would."""
    shipped = runner.steps_for
    monkeypatch.setattr(runner, "steps_for", lambda dialect: (*shipped(dialect), *steps))


ADD_NOTE = _parse(LATEST + 1, "add_note", "ALTER TABLE dt_tasks ADD COLUMN note TEXT;\n")
DROP_NOTE = _parse(LATEST + 2, "drop_note", "-- phase: post-deploy\nALTER TABLE dt_tasks DROP COLUMN note;\n")


def test_pre_deploy_steps_first_post_deploy_steps_once_old_code_is_gone(
    new_database: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(new_database(), "redis://127.0.0.1:1/0", "phases", data_dir=tmp_path)
    app.create_all()
    with monkeypatch.context() as release:  # the next release ships 3 (expand) and 4 (contract)
        extra_steps(release, ADD_NOTE, DROP_NOTE)
        with pytest.raises(SchemaOutdatedError):
            app.check_schema()
        report = migrate(app.engine, pre_deploy=True)
        assert [s.label for s in report.applied] == [ADD_NOTE.label]
        status = checked(app)  # the new code runs without its post-deploy step
        assert (status.version, status.required, status.latest) == (
            ADD_NOTE.version,
            ADD_NOTE.version,
            DROP_NOTE.version,
        )
    with caplog.at_level(logging.WARNING, logger="durable_tasks.migrations.check"):
        assert checked(app).version == ADD_NOTE.version  # the old code still runs on the expanded schema
    assert f"newer than this code's {LATEST}" in caplog.text
    with monkeypatch.context() as release:
        extra_steps(release, ADD_NOTE, DROP_NOTE)
        assert [s.label for s in migrate(app.engine).applied] == [DROP_NOTE.label]
    knows = rf"changed for code that knows version {DROP_NOTE.version} or later; this code knows {LATEST}"
    with pytest.raises(SchemaTooNewError, match=knows):
        app.check_schema()  # the old code must not start on the contracted schema
    app.engine.dispose()


def test_a_failing_step_leaves_the_version_where_it_was(
    new_database: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = App(new_database(), "redis://127.0.0.1:1/0", "failing", data_dir=tmp_path)
    app.create_all()
    broken = _parse(
        LATEST + 1, "broken", "ALTER TABLE dt_tasks ADD COLUMN half TEXT;\nALTER TABLE no_such_table ADD x TEXT;\n"
    )
    extra_steps(monkeypatch, broken)
    with pytest.raises(sa.exc.DBAPIError):
        migrate(app.engine)
    with app.engine.connect() as conn:
        assert read_status(conn).version == LATEST
        columns = {c["name"] for c in sa.inspect(conn).get_columns("dt_tasks")}
    if app.engine.dialect.name == "mysql":  # InnoDB commits each DDL statement: the step is finished by hand
        assert "half" in columns
    else:
        assert "half" not in columns  # rolled back whole
    app.engine.dispose()


def test_an_unknown_target_is_a_migration_error(new_database: Callable[[], str], tmp_path: Path) -> None:
    engine = sa.create_engine(new_database())
    with pytest.raises(MigrationError, match="there is no version 0"):
        migrate(engine, to=0)
    engine.dispose()


def test_doctor_names_drift_missing_and_extra(new_database: Callable[[], str], tmp_path: Path) -> None:
    from durable_tasks.doctor import Facts, Level, check_schema
    from durable_tasks.migrations import schema_report

    app = App(new_database(), "redis://127.0.0.1:1/0", "drift", data_dir=tmp_path)
    app.create_all()
    assert schema_report(app.engine).drift == []
    due = model_shape(app.engine.dialect)["dt_outbox"].indexes  # the due index this dialect has
    name = next(n for n in due if n != "ix_dt_outbox_task_id")
    with app.engine.begin() as conn:
        conn.execute(sa.schema.DropIndex(next(ix for ix in outbox_table.indexes if ix.name == name)))
        conn.execute(sa.text("ALTER TABLE dt_tasks ADD COLUMN added_by_hand TEXT"))
    report = schema_report(app.engine)
    assert sorted(report.drift) == [
        f"dt_outbox: missing index {name} {due[name].describe()}",
        "dt_tasks: extra column added_by_hand",
    ]
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    finding = check_schema(Facts(app.settings, {}, {}, now, now, None, schema=report))
    assert finding.level is Level.ERROR
    assert f"missing index {name}" in finding.message
    app.engine.dispose()
