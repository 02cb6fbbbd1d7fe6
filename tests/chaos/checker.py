"""The checker: classify every accepted submission from database rows and the history log.

Like Jepsen's set/queue checkers, it judges outcomes, not mechanisms. Its inputs are plain
rows (``dt_tasks``, ``dt_attempts``, ``chaos_final_writes``, the DLQ stream) and history
events, so :func:`check` is a pure function and can be fed hand-made anomalies
(tests/chaos/test_checker.py). :func:`load_snapshot` is the only part that does I/O.

Each accepted submission (an idempotency key whose submit returned ``ok``) is ``ok`` or carries
one or more anomalies:

- ``lost`` (I1): no task row, not terminal within the settle time, a SUCCEEDED task without
  its final write, or a rerun that was acknowledged but is not the task's generation;
- ``duplicated-final-write`` (I2): more than one audit row for one task generation;
- ``stale-write`` (I3): an audit row (or the stored result) whose (generation, attempt) is not
  the final execution of its generation, or that was written after its generation was
  superseded by an acknowledged rerun;
- ``unaccounted-dead`` (I4): a healthy task DEAD or in the DLQ, or a poison task that is not
  DEAD with exactly one DLQ entry (or that has a final write);
- ``failed``: a healthy task that ended FAILED or CANCELLED (the chaos task never raises);
- ``duplicate-task``: one idempotency key resolved to more than one task;
- ``unexpected`` (I5): a task row nobody submitted (or whose every submit definitely failed);
- ``key-over-limit`` (I6): more finished executions of one concurrency key overlapped in time
  than its limit allows (the ``ckey`` and ``key_limit`` of ``exec`` events; durable_tasks.flow).
  An execution that never finished (its worker was SIGKILLed) has no end and is not counted:
  what the invariant then shows is that its slot was not leaked (every task still finishes).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = [
    "TERMINAL",
    "Anomaly",
    "AttemptRow",
    "AuditRow",
    "CheckResult",
    "DlqEntry",
    "Snapshot",
    "TaskRow",
    "Verdict",
    "check",
    "load_snapshot",
    "print_result",
    "summary_table",
]

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "DEAD", "CANCELLED"})


class Anomaly(StrEnum):
    """What can be wrong with one submission."""

    LOST = "lost"
    DUPLICATED_FINAL_WRITE = "duplicated-final-write"
    STALE_WRITE = "stale-write"
    UNACCOUNTED_DEAD = "unaccounted-dead"
    FAILED = "failed"
    DUPLICATE_TASK = "duplicate-task"
    UNEXPECTED = "unexpected"
    KEY_OVER_LIMIT = "key-over-limit"


@dataclass(frozen=True, slots=True)
class TaskRow:
    """The columns of ``dt_tasks`` the checker reads."""

    task_id: str
    key: str | None
    state: str
    generation: int
    attempt: int
    delivery: int = 0
    reclaims: int = 0
    failures: int = 0
    result: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One ``dt_attempts`` row."""

    task_id: str
    generation: int
    attempt: int
    outcome: str | None


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One ``chaos_final_writes`` row: a committed final write."""

    task_id: str
    generation: int
    attempt: int
    pid: int
    written_at: float


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One entry of the DLQ stream."""

    entry_id: str
    task_id: str | None
    generation: int | None


@dataclass(slots=True)
class Snapshot:
    """Everything the database and Redis say after the run."""

    tasks: list[TaskRow] = field(default_factory=list)
    attempts: list[AttemptRow] = field(default_factory=list)
    audit: list[AuditRow] = field(default_factory=list)
    dlq: list[DlqEntry] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    """One submission (idempotency key) or one unexpected task, and what is wrong with it."""

    key: str | None
    task_id: str | None
    poison: bool = False
    anomalies: list[tuple[Anomaly, str]] = field(default_factory=list)

    def add(self, anomaly: Anomaly, detail: str) -> None:
        self.anomalies.append((anomaly, detail))

    @property
    def ok(self) -> bool:
        return not self.anomalies


@dataclass(slots=True)
class CheckResult:
    """Counts per classification, the anomalous verdicts, and what the run exercised."""

    accepted: int = 0
    indeterminate: int = 0
    poison: int = 0
    ok: int = 0
    counts: dict[Anomaly, int] = field(default_factory=lambda: dict.fromkeys(Anomaly, 0))
    anomalous: list[Verdict] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """No anomaly of any kind."""
        return not any(self.counts.values())

    def count(self, anomaly: Anomaly) -> int:
        return self.counts.get(anomaly, 0)

    def as_dict(self) -> dict[str, int]:
        """Every count and stat under its printed name."""
        return {
            "accepted": self.accepted,
            "indeterminate": self.indeterminate,
            "poison": self.poison,
            "ok": self.ok,
            **{a.value: self.counts.get(a, 0) for a in Anomaly},
            **self.stats,
        }

    def describe(self, limit: int = 10) -> str:
        """The first anomalies, one per line (for assertion messages)."""
        lines = [
            f"{v.key or '-'} task={v.task_id or '-'}: {anomaly.value}: {detail}"
            for v in self.anomalous[:limit]
            for anomaly, detail in v.anomalies
        ]
        more = len(self.anomalous) - limit
        if more > 0:
            lines.append(f"... and {more} more anomalous submissions")
        return "\n".join(lines)

    def table(self, title: str = "checker") -> Table:
        """The classification as a rich table (one row per count)."""
        table = Table(title=escape(title))
        table.add_column("classification")
        table.add_column("count", justify="right")
        for name, value in self.as_dict().items():
            bad = name in {a.value for a in Anomaly} and value > 0
            table.add_row(f"[red]{name}[/]" if bad else name, f"[red]{value}[/]" if bad else str(value))
        return table


#: Columns of the multi-scenario summary (``summary_table``).
SUMMARY_COLUMNS = (
    "accepted",
    "ok",
    "lost",
    "duplicated-final-write",
    "stale-write",
    "unaccounted-dead",
    "failed",
    "duplicate-task",
    "unexpected",
    "key-over-limit",
    "executions",
    "re-executions",
    "fenced_out",
    "reclaims",
    "reconciled",
    "dlq",
)


#: Short headers for the summary table.
SHORT = {
    "duplicated-final-write": "dup-write",
    "stale-write": "stale",
    "unaccounted-dead": "unacc-dead",
    "duplicate-task": "dup-task",
    "unexpected": "unexp",
    "key-over-limit": "key>lim",
    "executions": "execs",
    "re-executions": "re-execs",
    "fenced_out": "fenced",
    "reconciled": "reconc",
    "outbox_backlog": "backlog",
}


def summary_table(rows: Sequence[tuple[str, CheckResult, Mapping[str, Any]]], title: str = "chaos") -> Table:
    """One row per scenario: its counts, then its extra columns (kills, settle time...)."""
    extra: list[str] = []
    for _, _, more in rows:
        extra += [k for k in more if k not in extra]
    table = Table(title=escape(title))
    table.add_column("scenario")
    for name in (*SUMMARY_COLUMNS, *extra):
        table.add_column(SHORT.get(name, name), justify="right")
    for scenario, result, more in rows:
        values = result.as_dict()
        cells = [str(values.get(c, 0)) for c in SUMMARY_COLUMNS]
        cells += [_fmt(more.get(c, "")) for c in extra]
        table.add_row(escape(scenario), *map(escape, cells))
    return table


def _fmt(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def print_result(result: CheckResult, title: str, console: Console | None = None) -> None:
    """Print the table and the first anomalies."""
    console = console or Console()
    console.print(result.table(title))
    if not result.clean:
        console.print(result.describe(20), markup=False)


# -- the pure part ---------------------------------------------------------------------------


def _result_token(result: str | None) -> tuple[int, int] | None:
    """(generation, attempt) named by a stored chaos verdict, None if it names none."""
    if result is None:
        return None
    try:
        value = json.loads(result)
        return int(value["generation"]), int(value["attempt"])
    except (ValueError, TypeError, KeyError):
        return None


def check(snapshot: Snapshot, history: Iterable[Mapping[str, Any]]) -> CheckResult:
    """Classify every submission of the history against the snapshot."""
    events = list(history)
    accepted: dict[str, set[str]] = defaultdict(set)  # key -> task ids the submitter was given
    attempted: set[str] = set()
    indeterminate_keys: set[str] = set()
    poison_keys: set[str] = set()
    reruns: dict[str, dict[int, float]] = defaultdict(dict)  # task -> new generation -> ack time
    executions: Counter[tuple[str, int]] = Counter()
    keyed = _KeyedRuns()
    for e in events:
        op, kind = e.get("op"), e.get("type")
        if op == "submit":
            key = str(e["key"])
            attempted.add(key)
            if kind == "invoke" and e.get("poison"):
                poison_keys.add(key)
            elif kind == "ok":
                accepted[key].add(str(e["task_id"]))
            elif kind == "info":
                indeterminate_keys.add(key)
        elif op == "rerun" and kind == "ok":
            generations = reruns[str(e["task_id"])]
            generation = int(e["generation"])
            generations[generation] = min(generations.get(generation, float("inf")), float(e["ts"]))
        elif op == "exec" and kind == "invoke":
            executions[(str(e["task_id"]), int(e["generation"]))] += 1
        if op == "exec" and e.get("ckey") is not None:
            keyed.record(e)
    indeterminate_keys -= set(accepted)

    by_key: dict[str | None, list[TaskRow]] = defaultdict(list)
    for t in snapshot.tasks:
        by_key[t.key].append(t)
    audit: dict[tuple[str, int], list[AuditRow]] = defaultdict(list)
    audit_by_task: dict[str, list[AuditRow]] = defaultdict(list)
    for row in snapshot.audit:
        audit[(row.task_id, row.generation)].append(row)
        audit_by_task[row.task_id].append(row)
    succeeded_attempts: dict[tuple[str, int], set[int]] = defaultdict(set)
    for at in snapshot.attempts:
        if at.outcome == "succeeded":
            succeeded_attempts[(at.task_id, at.generation)].add(at.attempt)
    dlq: dict[str, list[DlqEntry]] = defaultdict(list)
    for d in snapshot.dlq:
        if d.task_id is not None:
            dlq[d.task_id].append(d)

    result = CheckResult(accepted=len(accepted), indeterminate=len(indeterminate_keys))
    verdicts: list[Verdict] = []
    for key in sorted(accepted):
        rows = by_key.get(key, [])
        poison = key in poison_keys
        result.poison += int(poison)
        v = Verdict(key, rows[0].task_id if rows else None, poison)
        verdicts.append(v)
        ids = accepted[key] | {r.task_id for r in rows}
        if len(ids) > 1:
            v.add(Anomaly.DUPLICATE_TASK, f"key resolved to {len(ids)} tasks: {sorted(ids)}")
        if not rows:
            v.add(Anomaly.LOST, "accepted, but no task row exists")
            continue
        for task in rows:
            _judge_task(v, task, poison, audit, audit_by_task, succeeded_attempts, dlq, reruns)
    for key in sorted(indeterminate_keys):
        # Indeterminate submissions may exist or not, but never twice.
        rows = by_key.get(key, [])
        if len(rows) > 1:
            v = Verdict(key, rows[0].task_id)
            v.add(Anomaly.DUPLICATE_TASK, f"indeterminate key resolved to {len(rows)} tasks")
            verdicts.append(v)
    known = set(accepted) | indeterminate_keys
    for maybe_key, rows in by_key.items():
        if maybe_key is None or maybe_key not in known:
            for task in rows:
                v = Verdict(maybe_key, task.task_id)
                why = "its every submit failed" if maybe_key in attempted else "nobody submitted it"
                v.add(Anomaly.UNEXPECTED, f"task exists in state {task.state}, but {why}")
                verdicts.append(v)

    task_ids = {t.task_id for t in snapshot.tasks}
    for tid in sorted(set(audit_by_task) - task_ids):
        v = Verdict(None, tid)
        v.add(Anomaly.UNEXPECTED, f"{len(audit_by_task[tid])} final writes for a task that does not exist")
        verdicts.append(v)

    by_task = {v.task_id: v for v in verdicts if v.task_id is not None}
    for task_id, detail in keyed.over_limit():
        if task_id in by_task:
            by_task[task_id].add(Anomaly.KEY_OVER_LIMIT, detail)

    for v in verdicts:
        if v.ok:
            result.ok += 1
            continue
        result.anomalous.append(v)
        for anomaly in {a for a, _ in v.anomalies}:
            result.counts[anomaly] += 1
    attempt_outcomes = Counter(a.outcome for a in snapshot.attempts)
    result.stats = {
        "executions": sum(executions.values()),
        "re-executions": sum(n - 1 for n in executions.values() if n > 1),
        "fenced_out": attempt_outcomes.get("fenced_out", 0),
        "lost_attempts": attempt_outcomes.get("lost", 0),
        "reclaims": sum(t.reclaims for t in snapshot.tasks),
        "reruns": sum(len(g) for g in reruns.values()),
        "final_writes": len(snapshot.audit),
        "dlq": len(snapshot.dlq),
    }
    return result


class _KeyedRuns:
    """Executions of keyed tasks, ``exec`` invoke to ok, grouped by concurrency key."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, int, int], tuple[float, str, int]] = {}
        self.runs: dict[str, list[tuple[float, float, str]]] = defaultdict(list)

    def record(self, e: Mapping[str, Any]) -> None:
        ident = (str(e["task_id"]), int(e["generation"]), int(e["attempt"]))
        if e.get("type") == "invoke":
            self.started[ident] = (float(e["ts"]), str(e["ckey"]), int(e.get("key_limit") or 1))
        elif e.get("type") == "ok" and ident in self.started:
            start, key, _ = self.started[ident]
            self.runs[key].append((start, float(e["ts"]), ident[0]))

    def over_limit(self) -> list[tuple[str, str]]:
        """(task id, detail) for each execution that started while its key already had its
        limit of finished executions running."""
        limits = {key: limit for _, key, limit in self.started.values()}
        found: list[tuple[str, str]] = []
        for key, runs in self.runs.items():
            running: list[tuple[float, str]] = []  # (end, task) of the runs still going
            for start, end, task_id in sorted(runs):
                running = [(e, t) for e, t in running if e > start]
                if len(running) >= limits[key]:
                    others = ", ".join(t for _, t in running)
                    found.append((task_id, f"key {key!r} (limit {limits[key]}) ran alongside {others}"))
                running.append((end, task_id))
        return found


def _judge_task(
    v: Verdict,
    task: TaskRow,
    poison: bool,
    audit: Mapping[tuple[str, int], list[AuditRow]],
    audit_by_task: Mapping[str, list[AuditRow]],
    succeeded_attempts: Mapping[tuple[str, int], set[int]],
    dlq: Mapping[str, list[DlqEntry]],
    reruns: Mapping[str, dict[int, float]],
) -> None:
    tid, g = task.task_id, task.generation
    acked = reruns.get(tid, {})
    if acked and max(acked) != g:
        v.add(Anomaly.LOST, f"rerun to generation {max(acked)} was acknowledged, task is at generation {g}")
    writes = audit_by_task.get(tid, [])
    per_generation = Counter(w.generation for w in writes)
    for generation, n in sorted(per_generation.items()):
        if n > 1:
            v.add(Anomaly.DUPLICATED_FINAL_WRITE, f"{n} final writes for generation {generation}")
    for w in writes:
        if w.generation > g:
            v.add(Anomaly.STALE_WRITE, f"write of generation {w.generation} > the task's {g}")
        elif w.generation == g and (task.state != "SUCCEEDED" or w.attempt != task.attempt):
            v.add(
                Anomaly.STALE_WRITE,
                f"write of attempt {w.attempt} (gen {g}) but the task is {task.state} at attempt {task.attempt}",
            )
        elif w.generation < g:
            if w.attempt not in succeeded_attempts.get((tid, w.generation), set()):
                v.add(Anomaly.STALE_WRITE, f"write of gen {w.generation} attempt {w.attempt}, not its success")
            superseded = acked.get(w.generation + 1)
            if superseded is not None and w.written_at > superseded:
                v.add(
                    Anomaly.STALE_WRITE,
                    f"gen {w.generation} written {w.written_at - superseded:.3f}s after its rerun was acknowledged",
                )
    if task.state not in TERMINAL:
        v.add(Anomaly.LOST, f"not terminal: {task.state} (gen {g}, attempt {task.attempt}, delivery {task.delivery})")
        return
    dead_letters = dlq.get(tid, [])
    if poison:
        current = [d for d in dead_letters if d.generation in (None, g)]
        if task.state != "DEAD" or len(current) != 1 or writes:
            v.add(
                Anomaly.UNACCOUNTED_DEAD,
                f"poison task {task.state} with {len(current)} DLQ entries and {len(writes)} final writes",
            )
        return
    if task.state == "DEAD" or dead_letters:
        v.add(Anomaly.UNACCOUNTED_DEAD, f"healthy task {task.state} with {len(dead_letters)} DLQ entries")
        return
    if task.state != "SUCCEEDED":
        v.add(Anomaly.FAILED, f"healthy task ended {task.state}")
        return
    if not audit.get((tid, g)):
        v.add(Anomaly.LOST, f"SUCCEEDED (gen {g}, attempt {task.attempt}) without its final write")
    token = _result_token(task.result)
    if token is not None and token != (g, task.attempt):
        v.add(Anomaly.STALE_WRITE, f"stored result came from gen {token[0]} attempt {token[1]}")


# -- the I/O part -----------------------------------------------------------------------------


def load_snapshot(
    engine: sa.Engine, namespace: str, task_name: str, dlq_entries: Iterable[tuple[str, Mapping[str, str]]]
) -> Snapshot:
    """Read the rows of ``namespace`` (and the DLQ entries already fetched from Redis), all
    from one snapshot: the runtime's READ COMMITTED would give each SELECT its own, and a task
    committed between them (a run that did not settle is still working) would show its final
    write beside the RUNNING row read before it, a stale write that never was."""
    from durable_tasks.records import attempts_table, tasks_table

    from .app import final_writes_table

    t, a, f = tasks_table.c, attempts_table.c, final_writes_table.c
    with engine.connect() as conn:
        conn.execution_options(isolation_level="REPEATABLE READ")  # one snapshot (MySQL, PostgreSQL)
        tasks = [
            TaskRow(
                r.id, r.idempotency_key, r.state, r.generation, r.attempt, r.delivery, r.reclaims, r.failures, r.result
            )
            for r in conn.execute(
                sa.select(
                    t.id,
                    t.idempotency_key,
                    t.state,
                    t.generation,
                    t.attempt,
                    t.delivery,
                    t.reclaims,
                    t.failures,
                    t.result,
                ).where(t.namespace == namespace, t.name == task_name)
            )
        ]
        ids = {row.task_id for row in tasks}
        attempts = [
            AttemptRow(r.task_id, r.generation, r.attempt, r.outcome)
            for r in conn.execute(
                sa.select(a.task_id, a.generation, a.attempt, a.outcome).where(a.namespace == namespace)
            )
            if r.task_id in ids
        ]
        audit = [
            AuditRow(r.task_id, r.generation, r.attempt, r.pid, r.written_at)
            for r in conn.execute(sa.select(f.task_id, f.generation, f.attempt, f.pid, f.written_at))
        ]
    dlq = []
    for entry_id, fields in dlq_entries:
        generation = fields.get("g")
        dlq.append(
            DlqEntry(entry_id, fields.get("t"), int(generation) if generation and generation.isdigit() else None)
        )
    return Snapshot(tasks, attempts, audit, dlq)
