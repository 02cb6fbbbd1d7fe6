"""Run the core integration tests against a real 3-master Redis Cluster (with replicas).

    python -m tests.cluster.run_core [pytest args]      (make test-cluster)

Starts the cluster on loopback ports, points DT_TEST_REDIS_URL at it (``redis+cluster://``
with every node as a seed), runs the core suites, and stops every node it started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.cluster.harness import start_cluster

CORE = [
    "tests/integration/test_smoke.py",
    "tests/integration/test_submit.py",
    "tests/integration/test_dispatcher.py",
    "tests/integration/test_worker.py",
    "tests/integration/test_reaper.py",
    "tests/integration/test_group_commit.py",
    "tests/integration/test_failpoints.py",
    "tests/integration/test_agents.py",
]


def main(argv: list[str]) -> int:
    """Start the cluster, run pytest on the core suites, stop the cluster; pytest's exit code."""
    with tempfile.TemporaryDirectory(prefix="dt-cluster-") as tmp:
        cluster = start_cluster(Path(tmp))
        try:
            env = {**os.environ, "DT_TEST_REDIS_URL": cluster.url}
            return subprocess.run([sys.executable, "-m", "pytest", "-q", *CORE, *argv], env=env).returncode
        finally:
            cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
