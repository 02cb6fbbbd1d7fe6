"""Run the assistant on one question, in one process, until it answers.

    python -m examples.agent.run "what is 6 * 7?"        # prints run_id=<id>, turns, answer
    python -m examples.agent.run --resume <run_id>       # carry on after a crash or Ctrl-C

Settings come from ``DT_*`` environment variables (SQLite + embedded Valkey by default). The
process runs a dispatcher, a worker and a reaper (``App.run``) and stops once the run is DONE.
``--resume`` starts nothing new: the records already say what is left to do, and the reaper
hands work a killed process held back to this one once its lease has lapsed.

Exit status: 0 answered, 1 ``--timeout`` passed first, 2 usage error or unknown run, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any, TextIO

import anyio
from anyio import to_thread
from sqlmodel import Session

from durable_tasks import App, TaskNotFoundError
from durable_tasks.agents import Agent, RunInfo

from .app import QUESTION, build

__all__ = ["RunPrinter", "drive", "main"]


class RunPrinter:
    """Prints each turn once it is recorded, each turn's tool results once they settle, and
    the answer; safe to call with the same run over and over."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.turns: set[int] = set()
        self.settled: set[int] = set()
        self.answered = False

    def show(self, run: RunInfo) -> None:
        """Print whatever is new in ``run``."""
        for turn in run.turns:
            index: int = turn["index"]
            output: dict[str, Any] = turn["output"]
            if index not in self.turns:
                self.turns.add(index)
                self._print(f"turn {index}: {output.get('content') or ''}".rstrip())
                for call in output.get("tool_calls") or []:
                    self._print(f"  call {call['id']}: {call['name']}({json.dumps(call['arguments'])})")
            results = turn["tool_results"]
            if results is not None and index not in self.settled:
                self.settled.add(index)
                for call_id, result in results.items():
                    self._print(f"  result {call_id}: {json.dumps(result)}")
        if run.state == "DONE" and not self.answered:
            self.answered = True
            self._print(f"answer: {run.output}")

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)


async def drive(
    app: App, agent: Agent, run_id: str, *, out: TextIO, timeout: float | None = None, poll: float = 0.2
) -> bool:
    """Run dispatcher + worker + reaper until ``run_id`` is DONE (True) or ``timeout`` passes."""
    stop = anyio.Event()
    printer = RunPrinter(out)
    done = False

    async def watch() -> None:
        nonlocal done
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            while True:
                run = await to_thread.run_sync(agent.get_run, run_id)
                printer.show(run)
                if run.state == "DONE":
                    done = True
                    break
                await anyio.sleep(poll)
        stop.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await app.run(stop=stop)  # returns after stop: in-flight tasks get shutdown_grace
            tg.cancel_scope.cancel()
    finally:
        await app.aclose()
    return done


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.agent.run", description="Run the assistant on one question until it answers."
    )
    parser.add_argument("question", nargs="?", help=f"what to ask (default: {QUESTION!r})")
    parser.add_argument("--resume", metavar="RUN_ID", help="carry on with an existing run; starts nothing new")
    parser.add_argument("--timeout", type=float, default=None, help="give up (exit 1) after this many seconds")
    args = parser.parse_args(argv)
    if args.resume and args.question:
        parser.error("give a question or --resume RUN_ID, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app, agent = build()
    app.create_all()
    if args.resume:
        run_id: str = args.resume
        try:
            agent.get_run(run_id)
        except TaskNotFoundError:
            print(f"no run {run_id!r} in namespace {app.settings.namespace!r}", file=sys.stderr)
            return 2
    else:
        with Session(app.engine) as session:  # the run, its turn-0 task and outbox row: one commit
            run_id = agent.start(session, args.question or QUESTION)
            session.commit()
    print(f"run_id={run_id}", flush=True)
    try:
        done = anyio.run(lambda: drive(app, agent, run_id, out=sys.stdout, timeout=args.timeout))
    except KeyboardInterrupt:
        print(f"interrupted; the run is durable: resume with --resume {run_id}", file=sys.stderr)
        return 130
    if not done:
        print(f"timed out; resume with --resume {run_id}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
