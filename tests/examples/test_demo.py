"""`python -m examples.demo` (the repository's demo, not a command of the library) runs end to end on
the embedded default and checks its invariants."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(180)  # the demo's own limit is 120 s (below); this leaves it room to report
def test_the_demo_passes_its_invariant_checks(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--data-dir", str(tmp_path / "demo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a worker was killed mid-task" in proc.stdout
    assert "model called once per turn" in proc.stdout
    assert "FAILED" not in proc.stdout
    assert not (tmp_path / "demo" / "valkey.json").exists()  # the embedded server was stopped
