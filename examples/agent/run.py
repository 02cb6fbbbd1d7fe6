"""Run the assistant on one question, in one process, until it answers.

    python -m examples.agent.run "what is 6 * 7?"        # prints task_id=<id>, each journal entry, the answer
    python -m examples.agent.run --resume <task_id>      # carry on after a crash or Ctrl-C

Settings come from ``DT_*`` environment variables (SQLite + embedded Valkey by default). The
process runs a dispatcher, a worker and a reaper (``App.run``) and stops once the run's task has
its result. ``--resume`` submits nothing: the journal already says what is done, and the reaper
hands work a killed process held back to this one once its lease has lapsed.

Exit status: 0 answered, 1 ``--timeout`` passed first or the run failed, 2 usage error or
unknown task, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import TextIO

import anyio
from anyio import to_thread
from sqlmodel import Session

from durable_tasks import App, StepInfo, TaskNotFoundError, TaskState

from .app import QUESTION, build

__all__ = ["JournalPrinter", "drive", "main"]


class JournalPrinter:
    """Prints each journal entry of the run once it is done (a model response, a tool's outcome)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown: set[str] = set()

    def show(self, steps: list[StepInfo]) -> None:
        """Print whatever is new."""
        for step in steps:
            if not step.done or step.slot in self.shown:
                continue
            self.shown.add(step.slot)
            if step.kind == "child":
                outcome = step.result if step.child_state == "SUCCEEDED" else f"{step.child_state}: {step.error}"
                print(f"  tool {step.label}: {outcome}", file=self.out, flush=True)
            else:
                print(f"step {step.label}", file=self.out, flush=True)


async def drive(app: App, task_id: str, *, out: TextIO, timeout: float | None = None, poll: float = 0.2) -> TaskState:
    """Run dispatcher + worker + reaper until the task is final or ``timeout`` passes; returns its state."""
    stop = anyio.Event()
    printer = JournalPrinter(out)
    state = TaskState.PENDING

    async def watch() -> None:
        nonlocal state
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            while True:
                printer.show(await to_thread.run_sync(app.steps, task_id))
                info = await to_thread.run_sync(app.get_task, task_id)
                state = info.state
                if state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED):
                    print(
                        f"answer: {info.result}" if state == TaskState.SUCCEEDED else f"{state}: {info.error_message}",
                        file=out,
                        flush=True,
                    )
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
    return state


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.agent.run", description="Run the assistant on one question until it answers."
    )
    parser.add_argument("question", nargs="?", help=f"what to ask (default: {QUESTION!r})")
    parser.add_argument("--resume", metavar="TASK_ID", help="carry on with an existing run; submits nothing")
    parser.add_argument("--timeout", type=float, default=None, help="give up (exit 1) after this many seconds")
    args = parser.parse_args(argv)
    if args.resume and args.question:
        parser.error("give a question or --resume TASK_ID, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    assistant = build()
    app = assistant.app
    app.create_all()
    if args.resume:
        task_id: str = args.resume
        try:
            app.get_task(task_id)
        except TaskNotFoundError:
            print(f"no task {task_id!r} in namespace {app.settings.namespace!r}", file=sys.stderr)
            return 2
    else:
        with Session(app.engine) as session:  # the task and its outbox row: one commit
            task_id = assistant.ask.submit(session, args.question or QUESTION).id
            session.commit()
    print(f"task_id={task_id}", flush=True)
    try:
        state = anyio.run(lambda: drive(app, task_id, out=sys.stdout, timeout=args.timeout))
    except KeyboardInterrupt:
        print(f"interrupted; the run is durable: resume with --resume {task_id}", file=sys.stderr)
        return 130
    if state != TaskState.SUCCEEDED:
        print(f"not answered ({state}); resume with --resume {task_id}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
