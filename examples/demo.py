"""``python -m examples.demo [judge|agent|all]``: the two users end to end, on the embedded default.

A repository example, not a command of the library: it runs the judge and agent examples, which
a pip-installed ``durable_tasks`` does not ship (``make demo`` runs it from a clone).

Judge part: a dispatcher, two worker processes and a reaper run as real processes on a SQLite
file and an embedded Valkey. A batch of submissions (every verdict kind) goes in with a live
progress bar; one worker is SIGKILLed while it judges and its submission is recovered by
another; one submission is rejudged while its first judging still runs, and only the new
verdict lands. Agent part: a scripted agent run with parallel, flaky and slow tool calls.
The summary ends with invariant checks; any failure makes the exit code 1.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from sqlmodel import Session, select

from durable_tasks import App, TaskInfo, TaskState
from durable_tasks.embedded import ensure_valkey, stop_valkey

from .judge.app import build_app, init_db, rejudge, submit_solution
from .judge.models import Submission, SubmissionStatus, Verdict
from .judge.problems import SOLUTIONS
from .tracing import ENV, install_file_exporter, load_spans, render_tree

__all__ = ["main", "run"]

_NOTES: dict[str, str] = {}

APP_SPEC = "examples.judge.main:app"
FAST = {
    "DT_LEASE_TIMEOUT": "1.5",
    "DT_HEARTBEAT_INTERVAL": "0.4",
    "DT_REAPER_INTERVAL": "0.5",
    "DT_POLL_INTERVAL": "0.1",
    "DT_READ_BLOCK": "0.2",
    "DT_CONCURRENCY": "3",
    "DT_RETRY_BACKOFF_INITIAL": "0.2",
    "DT_RETRY_BACKOFF_MAX": "1",
}


@dataclass
class Checks:
    """Invariant checks, in the order they ran."""

    results: dict[str, bool] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def check(self, name: str, ok: bool) -> None:
        self.results[name] = bool(ok)

    @property
    def passed(self) -> bool:
        return all(self.results.values())


class Processes:
    """The runtime's processes, started by us and stopped by pid."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, role: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable_tasks", role, APP_SPEC], env=self.env, stdout=log, stderr=log
        )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> int:
        proc = self.procs.pop(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return proc.pid

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _env(data_dir: Path, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        **FAST,
        "DT_DATABASE_URL": f"sqlite:///{(data_dir / 'demo.sqlite3').resolve()}",
        "DT_REDIS_URL": redis_url,
        "DT_NAMESPACE": "demo",
        "DT_DATA_DIR": str(data_dir),
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }


def _fresh(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    for old in data_dir.glob("demo.sqlite3*"):
        old.unlink()
    for old in data_dir.glob("*.log"):
        old.unlink()


def run_judge(console: Console, data_dir: Path, redis_url: str, checks: Checks) -> Table:
    """The judge part; returns its summary table."""
    env = _env(data_dir, redis_url)
    os.environ.update({k: v for k, v in env.items() if k.startswith("DT_")})
    app = build_app()
    init_db(app)
    procs = Processes(env, data_dir)
    for name, role in (
        ("dispatcher", "dispatcher"),
        ("worker-1", "worker"),
        ("worker-2", "worker"),
        ("reaper", "reaper"),
    ):
        procs.start(name, role)
    try:
        return _judge_batch(console, app, procs, checks)
    finally:
        procs.stop_all()


def _judge_batch(console: Console, app: App, procs: Processes, checks: Checks) -> Table:
    expected: dict[int, Verdict] = {}
    second_round: list[int] = []  # any of these may be rejudged while it runs (every verdict is deterministic)
    with Session(app.engine) as session:
        for round_ in range(2):
            for problem_id, by_verdict in SOLUTIONS.items():
                for verdict, code in by_verdict.items():
                    sub = submit_solution(
                        app,
                        session,
                        problem_id,
                        f"user{round_}",
                        "python",
                        code,
                        request_id=f"demo-{round_}-{problem_id}-{verdict.name}",
                    )
                    assert sub.id is not None
                    expected[sub.id] = verdict
                    if round_ == 1:
                        second_round.append(sub.id)
    console.print(f"submitted {len(expected)} submissions (every verdict kind) in one transaction each")
    killed: tuple[int, int] | None = None
    rejudged: int | None = None  # the submission rejudged in flight
    deadline = time.monotonic() + 50
    with Progress(
        TextColumn("[bold]judging"), BarColumn(), TextColumn("{task.completed}/{task.total}"), console=console
    ) as progress:
        bar = progress.add_task("judging", total=len(expected))
        while time.monotonic() < deadline:
            subs = _load(app, list(expected))
            done = sum(1 for s in subs if s.status == SubmissionStatus.DONE and s.judged_generation == s.generation)
            progress.update(bar, completed=done)
            # The killed worker's submission and the rejudged one are kept apart: each is checked below.
            if killed is None:
                killed = _kill_a_busy_worker(app, procs, [s for s in subs if s.id != rejudged], console)
            if rejudged is None:
                candidates = [i for i in second_round if killed is None or i != killed[1]]
                rejudged = _rejudge_in_flight(app, candidates, subs, console)
            if done == len(expected) and killed is not None and rejudged is not None:
                break
            time.sleep(0.2)
    subs = _load(app, list(expected))
    infos = {s.id: app.get_task(s.task_id) for s in subs if s.task_id}
    wrong = [s.id for s in subs if s.verdict != expected[s.id]]  # type: ignore[index]
    checks.check("every submission judged", all(s.status == SubmissionStatus.DONE for s in subs))
    checks.check("every verdict as expected", not wrong)
    checks.check("verdict from the latest generation", all(s.judged_generation == s.generation for s in subs))
    checks.check("a worker was killed mid-task", killed is not None)
    if killed is not None:
        info = infos[killed[1]]
        checks.check(
            "the killed worker's submission recovered",
            info.state == TaskState.SUCCEEDED and any(a.outcome == "lost" for a in info.attempts),
        )
    checks.check("a submission was rejudged in flight", rejudged is not None)
    return _judge_summary(subs, infos)


def _load(app: App, ids: list[int]) -> list[Submission]:
    with Session(app.engine) as session:
        return list(session.exec(select(Submission).where(Submission.id.in_(ids))))  # type: ignore[union-attr]


def _kill_a_busy_worker(app: App, procs: Processes, subs: list[Submission], console: Console) -> tuple[int, int] | None:
    """SIGKILL a worker seen judging and start a replacement: (its pid, the submission it lost),
    or None when no worker is judging now or the kill missed (the next poll tries again)."""
    judging = [s for s in subs if s.task_id is not None and s.status == SubmissionStatus.JUDGING]
    seen = [app.get_task(s.task_id) for s in judging if s.task_id is not None]  # one read each
    name = next(
        (
            n
            for n, proc in procs.procs.items()
            if n.startswith("worker-") and any(_runs_on(info, proc.pid) for info in seen)
        ),
        None,
    )
    if name is None:
        return None
    pid = procs.kill(name)
    procs.start(f"{name}-replacement", "worker")
    # A judging takes a few tenths of a second: the one seen running may have committed between
    # that read and the kill. One the dead worker still holds RUNNING now was surely lost with it.
    sub = next((s for s in judging if _running_on(app, s, pid)), None)
    if sub is None or sub.id is None:
        return None
    console.print(
        f"[red]SIGKILL[/] worker pid {pid} while it judged submission {sub.id}; "
        "its lease will expire and the reaper redelivers it"
    )
    return pid, sub.id


def _running_on(app: App, sub: Submission, pid: int) -> bool:
    """Whether the submission's judging runs now on the worker process ``pid``."""
    assert sub.task_id is not None
    return _runs_on(app.get_task(sub.task_id), pid)


def _runs_on(info: TaskInfo, pid: int) -> bool:
    """Whether the task read as ``info`` was running on the worker process ``pid``."""
    return info.state == TaskState.RUNNING and bool(info.attempts) and f":{pid}:" in info.attempts[-1].worker_id


def _rejudge_in_flight(app: App, candidates: list[int], subs: list[Submission], console: Console) -> int | None:
    """Rejudge one of ``candidates`` whose first judging is running now: its id, or None.
    A single chosen submission could finish between two polls (a judging takes a few tenths
    of a second): the demo once missed it and failed its check."""
    for sub in subs:
        if sub.id not in candidates or sub.task_id is None or sub.status != SubmissionStatus.JUDGING:
            continue
        if app.get_task(sub.task_id).state != TaskState.RUNNING:
            continue
        with Session(app.engine) as session:
            rejudge(app, session, sub.id)
        _NOTES["rejudged_task"] = sub.task_id
        console.print(
            f"[yellow]rejudge[/] submission {sub.id} while generation 0 still runs: its result will be fenced out"
        )
        return sub.id
    return None


def _judge_summary(subs: list[Submission], infos: Mapping[int | None, TaskInfo]) -> Table:
    tasks = list(infos.values())
    latencies = sorted(
        (i.finished_at - i.created_at).total_seconds() * 1000 for i in tasks if i.finished_at is not None
    )
    table = Table(title="judge")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for verdict in Verdict:
        table.add_row(f"verdict: {verdict.value}", str(sum(1 for s in subs if s.verdict == verdict)))
    attempts = [a for i in tasks for a in i.attempts]
    table.add_row("attempts", str(len(attempts)))
    table.add_row("recovered after a lost worker", str(sum(1 for a in attempts if a.outcome == "lost")))
    table.add_row("fenced-out results", str(sum(1 for a in attempts if a.outcome == "fenced_out")))
    table.add_row("dead letters", str(sum(1 for i in tasks if i.state == TaskState.DEAD)))
    if latencies:
        table.add_row("latency p50 (ms)", f"{statistics.median(latencies):.0f}")
        table.add_row("latency p99 (ms)", f"{latencies[min(len(latencies) - 1, round(0.99 * len(latencies)))]:.0f}")
    return table


def run_agent(console: Console, data_dir: Path, redis_url: str, checks: Checks) -> Table:
    """The agent part: one pydantic-ai run with parallel, flaky and slow tool calls, in-process."""
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from .agent.app import EXPECTED_ANSWER, QUESTION, build, script

    model_calls = [0]

    def counted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        model_calls[0] += 1
        return script(messages, info)

    assistant = build(
        FunctionModel(counted),
        database_url=f"sqlite:///{(data_dir / 'demo.sqlite3').resolve()}",
        redis_url=redis_url,
        namespace="demo-agent",
        poll_interval=0.1,
        read_block=0.1,
        retry_backoff_initial=0.1,
        retry_backoff_max=0.2,
    )
    app = assistant.app
    app.create_all()
    with Session(app.engine) as session:
        run_id = assistant.ask.submit(session, QUESTION).id
        session.commit()
    console.print(f"[bold]agent[/] run {run_id}: {QUESTION}")
    started = time.monotonic()
    anyio.run(_drive_agent, app, run_id)
    steps = app.steps(run_id)
    for step in steps:
        outcome = step.result if step.child_state in (None, "SUCCEEDED") else f"{step.child_state}: {step.error}"
        console.print(f"  {step.kind} {step.label[:60]}" + (f" -> {str(outcome)[:70]}" if step.kind == "child" else ""))
    tasks = [app.get_task(s.child_task_id) for s in steps if s.child_task_id]
    info = app.get_task(run_id)
    turns = sum(1 for s in steps if s.kind == "step" and "model.request" in s.label)
    checks.check("agent run answered", info.state == TaskState.SUCCEEDED and info.result == EXPECTED_ANSWER)
    checks.check("model called once per turn", model_calls[0] == turns)
    checks.check(
        "each tool call committed once", all(sum(a.outcome == "succeeded" for a in t.attempts) == 1 for t in tasks)
    )
    table = Table(title="agent")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("turns (model calls)", f"{turns} ({model_calls[0]})")
    table.add_row("tool calls", str(len(tasks)))
    table.add_row("tool attempts (flaky_search retried)", str(sum(len(t.attempts) for t in tasks)))
    table.add_row("run attempts (suspended while its tools ran)", str(len(info.attempts)))
    table.add_row("run time (s)", f"{time.monotonic() - started:.1f}")
    return table


async def _drive_agent(app: App, run_id: str) -> None:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(stop=stop))
        with anyio.fail_after(40):
            while app.get_task(run_id).state not in (TaskState.SUCCEEDED, TaskState.FAILED):  # noqa: ASYNC110
                await anyio.sleep(0.1)
        stop.set()
    await app.aclose()


def run(console: Console, part: str, data_dir: Path, trace_file: Path | None = None) -> int:
    """Run ``part`` ("judge", "agent" or "all"); returns the exit code. With ``trace_file``,
    every process exports its spans there and the rejudged submission's trace is drawn."""
    _fresh(data_dir)
    if trace_file is not None:
        trace_file.unlink(missing_ok=True)
        os.environ[ENV] = str(trace_file.resolve())
        install_file_exporter(trace_file, "demo")
    redis_url = ensure_valkey(data_dir)
    checks = Checks()
    tables: list[Table] = []
    started = time.monotonic()
    try:
        if part in ("judge", "all"):
            tables.append(run_judge(console, data_dir, redis_url, checks))
        if part in ("agent", "all"):
            tables.append(run_agent(console, data_dir, redis_url, checks))
    finally:
        stop_valkey(data_dir)
    for table in tables:
        console.print(table)
    if trace_file is not None and "rejudged_task" in _NOTES:
        _print_trace(console, trace_file, _NOTES["rejudged_task"])
    verdicts = Table(title=f"invariants · {time.monotonic() - started:.1f} s")
    verdicts.add_column("check")
    verdicts.add_column("result")
    for name, ok in checks.results.items():
        verdicts.add_row(name, "[green]ok[/]" if ok else "[red]FAILED[/]")
    console.print(verdicts)
    return 0 if checks.passed else 1


def _print_trace(console: Console, trace_file: Path, task_id: str) -> None:
    import sqlalchemy as sa

    from durable_tasks.records import tasks_table

    app = build_app()
    with app.engine.connect() as conn:
        traceparent = conn.execute(sa.select(tasks_table.c.traceparent).where(tasks_table.c.id == task_id)).scalar()
    if not traceparent:
        return
    time.sleep(0.5)  # the last spans of the stopped processes are flushed on exit
    tree = render_tree(load_spans(trace_file), traceparent.split("-")[1])
    console.print(f"[bold]trace of the rejudged submission (task {task_id})[/]")
    console.print(tree, markup=False, highlight=False)


def main(
    part: Annotated[str, typer.Argument(help="judge, agent, or all")] = "all",
    data_dir: Annotated[Path, typer.Option(help="Where the demo's SQLite file and Valkey live")] = Path(
        ".durable_tasks/demo"
    ),
    trace: Annotated[
        Path | None, typer.Option(help="Export every process's spans to this file and draw one trace")
    ] = None,
) -> None:
    """The two users end to end on the embedded default: an online judge (worker killed
    mid-task, a rejudge in flight) and a durable agent run; exits 1 if an invariant fails."""
    if part not in ("judge", "agent", "all"):
        raise typer.BadParameter("part must be judge, agent or all")
    raise typer.Exit(run(Console(), part, data_dir, trace))


if __name__ == "__main__":
    typer.run(main)
