"""``python -m tests.chaos``: the FULL chaos set (10,000 tasks, 50 kills by default).

Starts its own PostgreSQL (or uses ``DT_CHAOS_DATABASE_URL``; with ``--database mysql`` the
MySQL/MariaDB of ``DT_TEST_MYSQL_URL``, the machine's by default), runs every scenario (or those
named with ``--only``), prints the checker's table per scenario and a summary, and exits 1
if any scenario found an anomaly, did not settle, or missed an expectation.

    python -m tests.chaos                      # full: 10,000 tasks, 50 kills
    python -m tests.chaos --tasks 300 --kills 5 --only worker_kills --only poison
    python -m tests.chaos --database mysql     # the same on MySQL/MariaDB (DT_TEST_MYSQL_URL)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from sqlalchemy.exc import DBAPIError

from .checker import print_result, summary_table
from .harness import Postgres
from .mysql import MySql
from .scenarios import KNOWN_BUGS, POSTGRES_ONLY, SCENARIOS, Outcome, ScenarioContext, Size, run_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--tasks", type=int, default=int(os.environ.get("DT_CHAOS_TASKS", "10000")))
    parser.add_argument("--kills", type=int, default=int(os.environ.get("DT_CHAOS_KILLS", "50")))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run only these (repeatable)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep servers, logs and histories here")
    parser.add_argument("--json", type=Path, default=None, help="write the counts of every scenario here")
    parser.add_argument(
        "--database", choices=("postgres", "mysql"), default="postgres", help="the database the runtime uses"
    )
    args = parser.parse_args(argv)

    console = Console(width=max(Console().width, 240))
    seed = args.seed if args.seed is not None else int(os.environ.get("DT_CHAOS_SEED", random.randrange(2**31)))
    size = Size(args.tasks, args.kills, settle_timeout=max(60.0, args.tasks / 50))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dt-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = args.only or [n for n in SCENARIOS if args.database == "postgres" or n not in POSTGRES_ONLY]
    console.print(
        f"chaos on {args.database}: {len(names)} scenarios, {size.tasks} tasks, {size.kills} kills, seed {seed}, "
        f"in {workdir}"
    )

    def log(message: str) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} {message}", markup=False, highlight=False)

    outcomes: list[Outcome] = []
    failed = False
    started = time.monotonic()
    try:
        postgres: Postgres | MySql = MySql.start() if args.database == "mysql" else Postgres.start(workdir / "postgres")
    except DBAPIError as exc:  # no MySQL/MariaDB here: say so, as the tests' skip does
        console.print(f"chaos on {args.database}: skipped, no server answers ({exc.orig}); set DT_TEST_MYSQL_URL")
        return 0
    try:
        for i, name in enumerate(names):
            ctx = ScenarioContext(postgres, workdir, size, seed + i, log)
            outcome = run_scenario(name, ctx)
            outcomes.append(outcome)
            if outcome.skipped:
                console.print(f"{name}: skipped: {outcome.skipped}", style="yellow", markup=False)
                continue
            print_result(outcome.result, f"{name} (seed {outcome.seed})", console)
            for text, ok in outcome.expectations:
                console.print(f"  {'[green]✓[/]' if ok else '[red]✗[/]'} {escape(text)}")
            problems = outcome.failures()
            if problems and outcome.known_bug:
                console.print(f"{name}: expected failure: {outcome.known_bug}", style="yellow", markup=False)
                continue
            if not problems and name in KNOWN_BUGS:
                problems = [f"passed, but it reproduces a known bug: is it fixed? ({KNOWN_BUGS[name][:80]}...)"]
            failed = failed or bool(problems)
            for problem in problems:
                console.print(f"{name}: {problem}", style="red", markup=False)
    finally:
        postgres.close()
    rows = [(o.name, o.result, {"verdict": _verdict(o), **o.columns()}) for o in outcomes if not o.skipped]
    title = f"chaos summary on {args.database}: {size.tasks} tasks, {size.kills} kills, seed {seed}"
    console.print(summary_table(rows, title))
    known = [o.name for o in outcomes if o.known_bug and o.failures()]
    verdict = "FAILED" if failed else "no new failures"
    if known:
        verdict += f"; known library bugs reproduced in: {', '.join(known)} (see docs/reliability.md)"
    console.print(f"total {time.monotonic() - started:.0f}s; {verdict}", markup=False)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "tasks": size.tasks,
                    "kills": size.kills,
                    "seed": seed,
                    "total_s": time.monotonic() - started,
                    "scenarios": {
                        o.name: {
                            "verdict": _verdict(o),
                            "skipped": o.skipped,
                            "known_bug": o.known_bug,
                            **o.result.as_dict(),
                            **o.columns(),
                            "expectations": o.expectations,
                            "failures": o.failures(),
                        }
                        for o in outcomes
                    },
                },
                indent=2,
                default=str,
            )
        )
    if args.workdir is None and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    elif failed:
        console.print(f"logs and histories kept in {workdir}")
    return 1 if failed else 0


def _verdict(outcome: Outcome) -> str:
    if outcome.skipped:
        return "skipped"
    if outcome.failures():
        return "known bug" if outcome.known_bug else "FAIL"
    return "FAIL (bug fixed?)" if outcome.name in KNOWN_BUGS else "pass"


if __name__ == "__main__":
    raise SystemExit(main())
