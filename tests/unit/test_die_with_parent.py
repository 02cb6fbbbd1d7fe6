"""valkey_keeper.die_with_parent: a child started with it dies with the process that started it,
however that process ends (the embedded Valkey with its keeper, a benchmark's workers with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

ROOT = Path(__file__).parents[2]

# A parent that starts a long-sleeping child as the benchmarks do, prints its pid, and waits.
PARENT = """
import signal, subprocess, sys, time
from durable_tasks.valkey_keeper import die_with_parent
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=die_with_parent(signal.SIGKILL)
)
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever adopted it to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_child_dies_when_the_process_that_started_it_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()  # SIGKILL: no finally of the parent's runs
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child), "the child outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()  # by pid: the parent this test started
            parent.wait(10)
        if child and alive(child):
            os.kill(child, signal.SIGKILL)  # by pid: its child, left only if the test failed
