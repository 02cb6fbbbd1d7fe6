"""The opt-in pytest plugin on the real servers: a user's test module runs the real runtime in a
thread (dt_running) and inline (dt_inline), and its namespace's Redis keys are gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from durable_tasks import App, testing
from durable_tasks.errors import SchemaMissingError

pytestmark = pytest.mark.slow

USER_TESTS = """
from pathlib import Path

from sqlmodel import Session

from durable_tasks import App, TaskContext


def test_real(dt_database_url, dt_redis_url, dt_namespace, dt_running):
    Path("namespace.txt").write_text(dt_namespace)
    app = App(dt_database_url, dt_redis_url, dt_namespace)

    @app.task(name="double", queue="plugin")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    app.create_all()
    dt_running(app)
    with Session(app.engine) as session:
        handle = double.submit(session, 21)
        session.commit()
    assert handle.result(timeout=30) == 42


def test_inline(dt_inline):
    app = App(namespace="inline")

    @app.task(name="double")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    runner = dt_inline(app)
    with Session(app.engine) as session:
        handle = double.submit(session, 4)
        session.commit()
    assert runner.drain() == 1
    assert handle.result(timeout=5) == 8
"""


@pytest.mark.timeout(180)
def test_a_users_tests_run_on_the_real_servers_and_leave_no_keys(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
    env |= {"DT_TEST_DATABASE_URL": postgres_url, "DT_TEST_REDIS_URL": redis_url}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "durable_tasks.pytest_plugin", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    namespace = (tmp_path / "namespace.txt").read_text()
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"dt:{{{namespace}:*")) == []
    finally:
        client.close()


def test_running_raises_what_ended_the_runtime(tmp_path: Path, redis_url: str) -> None:
    app = App(f"sqlite:///{tmp_path / 'no-schema.sqlite3'}", redis_url, "plugin-noschema", data_dir=tmp_path)
    with pytest.raises(SchemaMissingError, match="init-db"), testing.running(app):
        pass  # the runtime's schema check fails: the block's end raises it
