"""The chaos scenarios against real processes and servers (the reduced set by default).

Size: ``DT_CHAOS_TASKS`` (default 300) and ``DT_CHAOS_KILLS`` (default 5). The seed is fixed
(``SEED``), so ``make test`` runs the same fault schedule every time, and a failure prints it;
``DT_CHAOS_SEED`` picks another. ``python -m tests.chaos`` runs the full set and prints every table.
Each test asserts the checker's verdict (0 lost, 0 duplicate final writes, 0 stale writes,
DLQ = exactly the poison set), that the system settled within its bound, and that the
scenario's fault really landed (its expectations).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from .checker import print_result
from .harness import Postgres
from .scenarios import KNOWN_BUGS, SCENARIOS, ScenarioContext, Size, run_scenario

pytestmark = [
    pytest.mark.slow,  # spawns processes (the repo's meaning of "slow"; it still runs by default)
    # A scenario starts its servers and processes, injects its faults and waits for the system to
    # settle: tens of seconds alone, a few minutes on a 2-core machine shared with other suites.
    pytest.mark.timeout(600),
]


#: The fault schedule of every run under pytest (wall-clock interleavings still vary).
SEED = 1


def _params() -> list[object]:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name]))
        if name in KNOWN_BUGS
        else name
        for name in SCENARIOS
    ]


@pytest.mark.parametrize("name", _params())
def test_scenario(name: str, chaos_postgres: Postgres, tmp_path: Path) -> None:
    seed = int(os.environ.get("DT_CHAOS_SEED") or SEED)
    outcome = run_scenario(name, ScenarioContext(chaos_postgres, tmp_path, Size.from_env(), seed))
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    table = io.StringIO()
    print_result(outcome.result, f"{name} (seed {seed})", Console(file=table, width=100, color_system=None))
    print(table.getvalue())
    problems = outcome.failures()
    if problems and outcome.known_bug and name not in KNOWN_BUGS:
        pytest.xfail(outcome.known_bug)
    assert not problems, (
        f"{name} failed (replay with DT_CHAOS_SEED={seed}; logs and history in {outcome.workdir}):\n"
        + "\n".join(problems)
        + "\n"
        + table.getvalue()
    )
