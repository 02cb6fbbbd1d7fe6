"""The chaos scenarios against real processes and servers (the reduced set by default), on
PostgreSQL and on MySQL/MariaDB (``DT_TEST_MYSQL_URL``; skipped, saying why, without one).

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
from .mysql import MySql
from .scenarios import KNOWN_BUGS, SCENARIOS, ScenarioContext, Size, run_scenario

pytestmark = [
    pytest.mark.slow,  # spawns processes (the repo's meaning of "slow"; it still runs by default)
    # A scenario starts its servers and processes, injects its faults and waits for the system to
    # settle: tens of seconds alone, a few minutes on a 2-core machine shared with other suites.
    pytest.mark.timeout(600),
]


#: The fault schedule of every run under pytest (wall-clock interleavings still vary).
SEED = 1


#: The scenarios ``make test`` runs on MySQL/MariaDB too: those where the database's locks,
#: fences and idempotency are what is tested (``python -m tests.chaos --database mysql`` runs
#: every scenario but POSTGRES_ONLY).
MYSQL_REDUCED = (
    "worker_kills",
    "failpoint[worker.after_claim]",
    "failpoint[worker.after_commit]",
    "duplicate_submissions",
    "zombie_worker",
    "rerun_storm",
    "poison",
    "poison_collateral",
)
#: Failures the MySQL runs reproduce, not fixed yet.
MYSQL_KNOWN_BUGS: dict[str, str] = {}


def _params() -> list[object]:
    params: list[object] = []
    for database, names in (("postgres", list(SCENARIOS)), ("mysql", list(MYSQL_REDUCED))):
        known = KNOWN_BUGS if database == "postgres" else {**KNOWN_BUGS, **MYSQL_KNOWN_BUGS}
        for name in names:
            marks = [pytest.mark.xfail(strict=True, reason=known[name])] if name in known else []
            params.append(pytest.param(name, database, marks=marks))
    return params


@pytest.mark.parametrize(("name", "database"), _params())
def test_scenario(name: str, database: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    seed = int(os.environ.get("DT_CHAOS_SEED") or SEED)
    server: Postgres | MySql = request.getfixturevalue(f"chaos_{database}")
    outcome = run_scenario(name, ScenarioContext(server, tmp_path, Size.from_env(), seed))
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
