"""An inherited DT_FAILPOINTS arms nothing: only a program that calls
``failpoints.enable_from_environment()`` (the test apps) reads it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = (
    "import sys; from durable_tasks import failpoints;"
    "print(failpoints.ENABLED);"
    "print(failpoints.enable_from_environment() if 'arm' in sys.argv else []);"
    "print(failpoints.ENABLED)"
)


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")} | {"DT_FAILPOINTS": "worker.after_run=crash"}
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_an_inherited_variable_arms_nothing_and_says_so() -> None:
    proc = _probe()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "[]", "False"]
    assert "DT_FAILPOINTS is set but ignored" in proc.stderr


def test_a_test_program_arms_them_by_calling_enable_from_environment() -> None:
    proc = _probe("arm")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False", "['worker.after_run']", "True"]


def test_no_module_of_the_library_calls_enable_from_environment() -> None:
    callers = [
        path.relative_to(ROOT)
        for path in (ROOT / "durable_tasks").rglob("*.py")
        if path.name != "failpoints.py" and re.search(r"enable_from_environment|DT_FAILPOINTS", path.read_text())
    ]
    assert callers == []
