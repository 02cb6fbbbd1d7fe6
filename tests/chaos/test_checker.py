"""The checker itself can fail: hand-made histories with each anomaly must be classified so."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from .checker import (
    Anomaly,
    AttemptRow,
    AuditRow,
    CheckResult,
    DlqEntry,
    Snapshot,
    TaskRow,
    check,
    print_result,
    summary_table,
)

T0 = 1_000_000.0


def submitted(key: str, task_id: str, *, poison: bool = False, ts: float = T0) -> list[dict[str, Any]]:
    """An accepted submission: invoke, then ok with the task id."""
    return [
        {"ts": ts, "op": "submit", "type": "invoke", "key": key, "poison": poison},
        {"ts": ts + 0.01, "op": "submit", "type": "ok", "key": key, "task_id": task_id, "created": True},
    ]


def result(generation: int, attempt: int) -> str:
    return json.dumps({"sub": 1, "digest": "x", "generation": generation, "attempt": attempt})


def succeeded(task_id: str, key: str, *, generation: int = 0, attempt: int = 1) -> TaskRow:
    return TaskRow(task_id, key, "SUCCEEDED", generation, attempt, result=result(generation, attempt))


def write(task_id: str, generation: int = 0, attempt: int = 1, written_at: float = T0 + 1) -> AuditRow:
    return AuditRow(task_id, generation, attempt, pid=4242, written_at=written_at)


def only(res: CheckResult) -> set[Anomaly]:
    """The anomaly kinds found."""
    return {a for a, n in res.counts.items() if n}


def test_a_clean_run_is_all_ok() -> None:
    history = submitted("k1", "t1") + submitted("k2", "t2")
    snap = Snapshot(
        tasks=[succeeded("t1", "k1"), succeeded("t2", "k2", attempt=2)],
        attempts=[AttemptRow("t2", 0, 1, "lost"), AttemptRow("t2", 0, 2, "succeeded")],
        audit=[write("t1"), write("t2", attempt=2)],
    )
    res = check(snap, history)
    assert res.clean
    assert (res.accepted, res.ok) == (2, 2)
    assert res.stats["lost_attempts"] == 1


@pytest.mark.parametrize(
    ("tasks", "audit", "detail"),
    [
        ([], [], "no task row"),
        ([TaskRow("t1", "k1", "RUNNING", 0, 1)], [], "not terminal"),
        ([TaskRow("t1", "k1", "ENQUEUED", 0, 0)], [], "not terminal"),
        ([succeeded("t1", "k1")], [], "without its final write"),
    ],
    ids=["no-row", "running", "enqueued", "no-final-write"],
)
def test_lost_submissions_are_detected(tasks: list[TaskRow], audit: list[AuditRow], detail: str) -> None:
    res = check(Snapshot(tasks=tasks, audit=audit), submitted("k1", "t1"))
    assert only(res) == {Anomaly.LOST}
    assert res.count(Anomaly.LOST) == 1
    assert detail in res.describe()


def test_a_second_final_write_for_one_generation_is_a_duplicate() -> None:
    snap = Snapshot(tasks=[succeeded("t1", "k1")], audit=[write("t1"), write("t1")])
    res = check(snap, submitted("k1", "t1"))
    assert only(res) == {Anomaly.DUPLICATED_FINAL_WRITE}


def test_a_write_from_a_superseded_attempt_is_stale() -> None:
    # The zombie (attempt 1) and the current owner (attempt 2) both committed: one is a duplicate
    # of the generation, and attempt 1's row is not the task's final attempt.
    snap = Snapshot(tasks=[succeeded("t1", "k1", attempt=2)], audit=[write("t1", attempt=1), write("t1", attempt=2)])
    res = check(snap, submitted("k1", "t1"))
    assert only(res) == {Anomaly.DUPLICATED_FINAL_WRITE, Anomaly.STALE_WRITE}


def test_a_stale_write_alone_is_detected() -> None:
    # Only the stale attempt wrote: the task says attempt 2 won, the audit says attempt 1 wrote.
    snap = Snapshot(tasks=[succeeded("t1", "k1", attempt=2)], audit=[write("t1", attempt=1)])
    res = check(snap, submitted("k1", "t1"))
    assert Anomaly.STALE_WRITE in only(res)


def test_a_write_to_a_task_that_is_not_succeeded_is_stale() -> None:
    snap = Snapshot(tasks=[TaskRow("t1", "k1", "FAILED", 0, 1)], audit=[write("t1")])
    res = check(snap, submitted("k1", "t1"))
    assert Anomaly.STALE_WRITE in only(res)


def test_a_stored_result_from_another_execution_is_stale() -> None:
    task = TaskRow("t1", "k1", "SUCCEEDED", 0, 2, result=result(0, 1))
    res = check(Snapshot(tasks=[task], audit=[write("t1", attempt=2)]), submitted("k1", "t1"))
    assert only(res) == {Anomaly.STALE_WRITE}


def test_an_old_generation_written_after_its_rerun_was_acknowledged_is_stale() -> None:
    history = [*submitted("k1", "t1"), {"ts": T0 + 5, "op": "rerun", "type": "ok", "task_id": "t1", "generation": 1}]
    attempts = [AttemptRow("t1", 0, 1, "succeeded"), AttemptRow("t1", 1, 1, "succeeded")]
    task = succeeded("t1", "k1", generation=1)
    before = Snapshot(tasks=[task], attempts=attempts, audit=[write("t1", 0, 1, T0 + 4), write("t1", 1, 1, T0 + 6)])
    assert check(before, history).clean  # generation 0 finished before the rerun: legitimate
    after = Snapshot(tasks=[task], attempts=attempts, audit=[write("t1", 0, 1, T0 + 5.5), write("t1", 1, 1, T0 + 6)])
    res = check(after, history)
    assert only(res) == {Anomaly.STALE_WRITE}
    assert "after its rerun was acknowledged" in res.describe()


def test_an_old_generation_write_that_was_not_its_success_is_stale() -> None:
    history = [*submitted("k1", "t1"), {"ts": T0 + 5, "op": "rerun", "type": "ok", "task_id": "t1", "generation": 1}]
    attempts = [AttemptRow("t1", 0, 1, "fenced_out"), AttemptRow("t1", 1, 1, "succeeded")]
    snap = Snapshot(
        tasks=[succeeded("t1", "k1", generation=1)],
        attempts=attempts,
        audit=[write("t1", 0, 1, T0 + 4), write("t1", 1, 1, T0 + 6)],
    )
    assert only(check(snap, history)) == {Anomaly.STALE_WRITE}


def test_an_acknowledged_rerun_the_task_does_not_show_is_lost() -> None:
    history = [*submitted("k1", "t1"), {"ts": T0 + 5, "op": "rerun", "type": "ok", "task_id": "t1", "generation": 1}]
    snap = Snapshot(tasks=[succeeded("t1", "k1")], attempts=[AttemptRow("t1", 0, 1, "succeeded")], audit=[write("t1")])
    res = check(snap, history)
    assert only(res) == {Anomaly.LOST}
    assert "rerun to generation 1" in res.describe()


def test_a_healthy_task_in_the_dlq_is_unaccounted_dead() -> None:
    dead = TaskRow("t1", "k1", "DEAD", 0, 3)
    res = check(Snapshot(tasks=[dead], dlq=[DlqEntry("1-0", "t1", 0)]), submitted("k1", "t1"))
    assert only(res) == {Anomaly.UNACCOUNTED_DEAD}
    # ... and so is a healthy task that succeeded but still has a DLQ entry.
    snap = Snapshot(tasks=[succeeded("t1", "k1")], audit=[write("t1")], dlq=[DlqEntry("1-0", "t1", 0)])
    assert only(check(snap, submitted("k1", "t1"))) == {Anomaly.UNACCOUNTED_DEAD}


@pytest.mark.parametrize(
    ("task", "dlq", "audit"),
    [
        (TaskRow("p1", "kp", "DEAD", 0, 3), [], []),
        (TaskRow("p1", "kp", "DEAD", 0, 3), [DlqEntry("1-0", "p1", 0), DlqEntry("2-0", "p1", 0)], []),
        (TaskRow("p1", "kp", "SUCCEEDED", 0, 1, result=result(0, 1)), [], [write("p1")]),
        (TaskRow("p1", "kp", "FAILED", 0, 1), [DlqEntry("1-0", "p1", 0)], []),
    ],
    ids=["dead-not-in-dlq", "in-dlq-twice", "succeeded", "failed"],
)
def test_a_poison_task_not_dead_once_in_the_dlq_is_unaccounted(
    task: TaskRow, dlq: list[DlqEntry], audit: list[AuditRow]
) -> None:
    res = check(Snapshot(tasks=[task], dlq=dlq, audit=audit), submitted("kp", "p1", poison=True))
    assert Anomaly.UNACCOUNTED_DEAD in only(res)
    assert res.poison == 1


def test_a_poison_task_dead_once_in_the_dlq_is_ok() -> None:
    snap = Snapshot(tasks=[TaskRow("p1", "kp", "DEAD", 0, 3)], dlq=[DlqEntry("1-0", "p1", 0)])
    res = check(snap, submitted("kp", "p1", poison=True))
    assert res.clean
    assert res.stats["dlq"] == 1


def test_a_healthy_task_that_failed_is_reported() -> None:
    res = check(Snapshot(tasks=[TaskRow("t1", "k1", "FAILED", 0, 3)]), submitted("k1", "t1"))
    assert only(res) == {Anomaly.FAILED}


def test_one_key_resolving_to_two_tasks_is_a_duplicate_task() -> None:
    history = submitted("k1", "t1") + submitted("k1", "t2")
    snap = Snapshot(tasks=[succeeded("t1", "k1")], audit=[write("t1")])
    res = check(snap, history)
    assert only(res) == {Anomaly.DUPLICATE_TASK}
    # Two rows for one key (a broken unique constraint) are caught from the database side too.
    rows = Snapshot(tasks=[succeeded("t1", "k1"), succeeded("t2", "k1")], audit=[write("t1"), write("t2")])
    assert Anomaly.DUPLICATE_TASK in only(check(rows, submitted("k1", "t1")))


def test_tasks_and_writes_nobody_submitted_are_unexpected() -> None:
    snap = Snapshot(
        tasks=[succeeded("t1", "k1"), succeeded("t9", "ghost")],
        audit=[write("t1"), write("t9"), write("t404")],
    )
    res = check(snap, submitted("k1", "t1"))
    assert only(res) == {Anomaly.UNEXPECTED}
    assert res.count(Anomaly.UNEXPECTED) == 2  # the ghost task and the write for no task
    assert res.ok == 1


def test_indeterminate_submissions_may_exist_or_not_but_a_definite_failure_may_not() -> None:
    history = [
        {"ts": T0, "op": "submit", "type": "invoke", "key": "k1"},
        {"ts": T0 + 1, "op": "submit", "type": "info", "key": "k1", "detail": "connection lost during COMMIT"},
        {"ts": T0, "op": "submit", "type": "invoke", "key": "k2"},
        {"ts": T0 + 1, "op": "submit", "type": "info", "key": "k2", "detail": "connection lost during COMMIT"},
        {"ts": T0, "op": "submit", "type": "invoke", "key": "k3"},
        {"ts": T0 + 1, "op": "submit", "type": "fail", "key": "k3", "detail": "could not connect"},
    ]
    recovered = Snapshot(tasks=[succeeded("t1", "k1")], audit=[write("t1")])
    res = check(recovered, history)
    assert res.clean
    assert (res.accepted, res.indeterminate) == (0, 2)
    phantom = Snapshot(tasks=[succeeded("t3", "k3")], audit=[write("t3")])
    assert only(check(phantom, history)) == {Anomaly.UNEXPECTED}


def test_a_retried_submission_counts_once() -> None:
    history = [
        {"ts": T0, "op": "submit", "type": "invoke", "key": "k1"},
        {"ts": T0 + 1, "op": "submit", "type": "info", "key": "k1"},
        *submitted("k1", "t1", ts=T0 + 2),
    ]
    res = check(Snapshot(tasks=[succeeded("t1", "k1")], audit=[write("t1")]), history)
    assert res.clean
    assert (res.accepted, res.indeterminate, res.ok) == (1, 0, 1)


def test_executions_and_re_executions_are_counted_not_judged() -> None:
    execs = [
        {"ts": T0 + i, "op": "exec", "type": "invoke", "task_id": "t1", "generation": 0, "attempt": i + 1}
        for i in range(3)
    ]
    snap = Snapshot(
        tasks=[TaskRow("t1", "k1", "SUCCEEDED", 0, 3, delivery=2, reclaims=1, result=result(0, 3))],
        audit=[write("t1", attempt=3)],
    )
    res = check(snap, submitted("k1", "t1") + execs)
    assert res.clean  # the body ran three times: at-least-once is allowed
    assert (res.stats["executions"], res.stats["re-executions"]) == (3, 2)
    assert res.stats["reclaims"] == 1


def keyed_run(task_id: str, key: str, start: float, end: float | None, limit: int = 1) -> list[dict[str, Any]]:
    """One execution of a keyed task: exec invoke at ``start``, ok at ``end`` (None: it died)."""
    ids = {"task_id": task_id, "generation": 0, "attempt": 1, "ckey": key, "key_limit": limit}
    events = [{"ts": start, "op": "exec", "type": "invoke", **ids}]
    return events + ([{"ts": end, "op": "exec", "type": "ok", **ids}] if end is not None else [])


def keyed_snapshot(*task_ids: str) -> tuple[Snapshot, list[dict[str, Any]]]:
    history = [e for n, t in enumerate(task_ids) for e in submitted(f"k{n}", t)]
    snap = Snapshot(tasks=[succeeded(t, f"k{n}") for n, t in enumerate(task_ids)], audit=[write(t) for t in task_ids])
    return snap, history


def test_two_runs_of_one_key_at_once_are_over_a_limit_of_one() -> None:
    snap, history = keyed_snapshot("t1", "t2", "t3")
    history += keyed_run("t1", "user:1", T0 + 1, T0 + 2)
    history += keyed_run("t2", "user:1", T0 + 1.5, T0 + 2.5)  # overlaps t1
    history += keyed_run("t3", "user:2", T0 + 1.5, T0 + 2.5)  # another key: fine
    res = check(snap, history)
    assert only(res) == {Anomaly.KEY_OVER_LIMIT}
    assert [v.task_id for v in res.anomalous] == ["t2"]


def test_runs_of_one_key_in_turn_or_within_the_limit_are_ok() -> None:
    snap, history = keyed_snapshot("t1", "t2", "t3", "t4")
    history += keyed_run("t1", "user:1", T0 + 1, T0 + 2)
    history += keyed_run("t2", "user:1", T0 + 2, T0 + 3)  # starts as t1 ends
    history += keyed_run("t3", "run:9", T0 + 1, T0 + 3, limit=2)
    history += keyed_run("t4", "run:9", T0 + 2, T0 + 4, limit=2)  # two at once, limit 2
    assert check(snap, history).clean


def test_a_run_that_never_finished_is_not_counted_against_the_next() -> None:
    snap, history = keyed_snapshot("t1", "t2")
    history += keyed_run("t1", "user:1", T0 + 1, None)  # its worker was SIGKILLed
    history += keyed_run("t2", "user:1", T0 + 2, T0 + 3)
    assert check(snap, history).clean


def test_the_tables_render() -> None:
    res = check(Snapshot(tasks=[TaskRow("t1", "k1", "RUNNING", 0, 1)]), submitted("k1", "t1"))
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    print_result(res, "unit", console)
    console.print(summary_table([("unit", res, {"kills": 3, "settle_s": 1.25})]))
    text = out.getvalue()
    assert "lost" in text
    assert "not terminal" in text
    assert "1.2" in text
