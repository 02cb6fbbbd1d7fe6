"""A database made by the code before versioning (commit LEGACY_COMMIT, its own
``create_all()``), holding pending, running and finished tasks, upgrades in place with
``durable-tasks migrate``: nothing is lost, doctor finds no drift, and the tasks left
unfinished run to completion on the new code."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from durable_tasks import App, SchemaOutdatedError, TaskContext, TaskState
from durable_tasks.doctor import diagnose, gather_facts
from durable_tasks.migrations import schema_report, steps_for
from durable_tasks.store.schema import missing_indexes
from tests.helpers import FAST, run_until

#: The last commit whose create_all() made the schema without versions.
LEGACY_COMMIT = "2966201"
#: On MySQL/MariaDB (which that commit did not support): the commit before numbered MySQL
#: steps whose create_all() made the tables of version 9 (adopted there, then 10 onwards run).
MYSQL_LEGACY_COMMIT = "6062b26"
MYSQL_ADOPTED = 9
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture(scope="module")
def legacy_sources(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The durable_tasks package as it was at a commit, extracted from git history (once)."""
    extracted: dict[str, Path] = {}

    def source(commit: str) -> Path:
        if commit in extracted:
            return extracted[commit]
        if shutil.which("git") is None:
            pytest.skip("git is not installed: the pre-versioning code cannot be rebuilt")
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "durable_tasks"],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            pytest.skip(f"commit {commit} is not in this clone (shallow?): {archive.stderr.decode().strip()}")
        dest = tmp_path_factory.mktemp(f"legacy-{commit}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(dest, filter="data")
        extracted[commit] = dest
        return dest

    return source


class Add(BaseModel):
    a: int
    b: int


def rows(engine: sa.Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of the runtime's task tables, as stored, by column name."""
    with engine.connect() as conn:
        return {
            table: sorted(
                (dict(r._mapping) for r in conn.execute(sa.text(f"SELECT * FROM {table}"))),
                key=lambda r: str(r["id"]),
            )
            for table in ("dt_tasks", "dt_outbox", "dt_attempts")
        }


def as_before(after: dict[str, list[dict[str, Any]]], before: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``after`` with only the columns ``before`` had (later steps add columns, NULL in old rows)."""
    kept: dict[str, Any] = {}
    for table, old_rows in before.items():
        columns = old_rows[0].keys() if old_rows else set()
        kept[table] = [{c: row[c] for c in columns} for row in after[table]]
        added = {c for row in after[table] for c in row if c not in columns}
        assert all(row[c] is None for row in after[table] for c in added), (table, added)
    return kept


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from durable_tasks.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def seed_with_legacy_code(legacy: Path, url: str, redis_url: str, namespace: str, data: Path) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "apps" / "legacy_seed.py"), url, redis_url, namespace, str(data)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(legacy)},
        cwd=data.parent,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seeded = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(seeded["module"]).is_relative_to(legacy), seeded["module"]  # the old code ran, not ours
    states: dict[str, str] = seeded["states"]
    return states


async def run_until_settled(app: App, task_ids: list[str]) -> None:
    """Run dispatcher, worker and reaper until every task has a final state."""

    def settled() -> bool:
        return all(app.get_task(t).state in (TaskState.SUCCEEDED, TaskState.FAILED) for t in task_ids)

    await run_until(app, settled, timeout=90)


@pytest.mark.usefixtures("clean_redis")
async def test_a_database_made_before_versioning_upgrades_in_place(
    new_database: Callable[[], str],
    legacy_sources: Callable[[str], Path],
    redis_url: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    url = new_database()
    mysql = sa.make_url(url).get_backend_name() == "mysql"
    legacy = legacy_sources(MYSQL_LEGACY_COMMIT if mysql else LEGACY_COMMIT)
    adopted = MYSQL_ADOPTED if mysql else 1
    data = tmp_path / "data"
    states = seed_with_legacy_code(legacy, url, redis_url, namespace, data)
    assert sorted(states.values()) == ["ENQUEUED", "ENQUEUED", "PENDING", "PENDING", "RUNNING", "SUCCEEDED"]

    settings: dict[str, Any] = {**FAST, "reaper_interval": timedelta(milliseconds=200)}
    app = App(url, redis_url, namespace, data_dir=data, **settings)

    @app.task(name="upgrade.add", queue="upgrade")
    def add(ctx: TaskContext[Add], p: Add) -> int:
        return p.a + p.b

    before = rows(app.engine)
    with pytest.raises(SchemaOutdatedError, match=r"predate schema versioning: run `durable-tasks migrate`"):
        app.check_schema()

    migrated = cli("migrate", env={"DT_DATABASE_URL": url, "DT_DATA_DIR": str(data)})
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert f"the existing tables match version {adopted}: recorded as version {adopted}" in migrated.stdout
    for step in steps_for(app.engine.dialect)[adopted:]:
        assert f"applied {step.label} ({step.phase.value})" in migrated.stdout
    if mysql:  # adopted past version 2, and yet dt_submit is there: its step runs when adopted
        routine = (
            "SELECT COUNT(*) FROM information_schema.ROUTINES "
            "WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = 'dt_submit'"
        )
        with app.engine.connect() as conn:
            assert conn.execute(sa.text(routine)).scalar() == 1
            made = conn.exec_driver_sql("CALL dt_submit('probe', 'probe', 'probe', '{}', NULL, 3, FALSE, NULL, NULL)")
            assert uuid.UUID(made.scalar_one()).version == 7  # step 13's procedure, made after step 2's
            conn.rollback()
    again = cli("migrate", "--check", env={"DT_DATABASE_URL": url, "DT_DATA_DIR": str(data)})
    assert again.returncode == 0, again.stdout

    assert as_before(rows(app.engine), before) == before  # not a row lost or changed
    report = schema_report(app.engine)
    assert (report.problem, report.drift) == (None, [])
    assert missing_indexes(app.engine) == []
    findings = {f.check: f for f in diagnose(await gather_facts(app))}
    assert findings["schema"].level.value == "ok", findings["schema"].message
    assert findings["indexes"].level.value == "ok", findings["indexes"].message

    await run_until_settled(app, list(states))
    for task_id in states:
        info = app.get_task(task_id)
        assert info.state is TaskState.SUCCEEDED, (task_id, info)
        assert info.result is not None
    await app.aclose()
