"""The judge example on MariaDB, configured the way its README deploys it: ``DT_DATABASE_URL``
names a ``mysql+pymysql://`` database, ``python -m examples.judge.main init-db`` makes the
tables, ``durable-tasks run examples.judge.main:app`` judges a submission made in the caller's
transaction, and the verdict lands through the hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from sqlmodel import Session

from examples.judge.app import build_app, submit_solution
from examples.judge.models import Submission, SubmissionStatus, Verdict
from examples.judge.problems import SOLUTIONS
from tests.helpers import assert_running, block_until, cli_process

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def judge_env(
    mysql_url: str, redis_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    values = {
        "DT_DATABASE_URL": mysql_url,
        "DT_REDIS_URL": redis_url,
        "DT_NAMESPACE": namespace,
        "DT_DATA_DIR": str(tmp_path / "data"),
        "DT_POLL_INTERVAL": str(timedelta(milliseconds=100).total_seconds()),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    yield {**os.environ, **values}
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"dt:{{{namespace}:*", count=1000):
        client.delete(key)
    client.close()


def test_the_judge_example_runs_on_mariadb_from_dt_database_url(judge_env: dict[str, str]) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "examples.judge.main", "init-db"],
        cwd=ROOT,
        env=judge_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert "tables ready" in made.stdout
    app = build_app()  # from the DT_* variables, as examples/judge/main.py builds it
    assert app.engine.url.get_backend_name() == "mysql"
    with Session(app.engine) as session:
        accepted = submit_solution(
            app, session, "a-plus-b", "alice", "python", SOLUTIONS["a-plus-b"][Verdict.ACCEPTED], f"r-{uuid.uuid4()}"
        )
    try:
        with cli_process("run", "examples.judge.main:app", env=judge_env) as proc:

            def judged() -> bool:
                assert_running(proc)
                with Session(app.engine) as session:
                    row = session.get(Submission, accepted.id)
                return row is not None and row.status == SubmissionStatus.DONE

            block_until(judged, timeout=90, what="the verdict on MariaDB")
            with Session(app.engine) as session:
                row = session.get(Submission, accepted.id)
            assert row is not None
            assert (row.verdict, row.score) == (Verdict.ACCEPTED, 100)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
    finally:
        app.engine.dispose()
