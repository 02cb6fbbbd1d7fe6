"""The online-judge example: sandbox verdicts, the submit → dispatch → work → hook path,
idempotent submits, a rejudge that fences out a still-running older generation, the HTTP API."""

from __future__ import annotations

import ast
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, col, func, select

from durable_tasks import App, TaskState
from examples.judge.api import create_api
from examples.judge.app import (
    JUDGE_QUEUE,
    JUDGE_TASK,
    JUDGE_TIMEOUT,
    RequestIdReusedError,
    UnknownProblemError,
    UnsupportedLanguageError,
    build_app,
    init_db,
    install_judge,
    rejudge,
    submit_solution,
)
from examples.judge.models import Problem, Submission, SubmissionStatus, Verdict
from examples.judge.problems import PROBLEM_SPECS, SOLUTIONS, make_problem, make_problems
from examples.judge.sandbox import (
    SANDBOX_ENV,
    JudgeAbortedError,
    JudgeFunction,
    JudgeResult,
    judge_submission,
    outputs_match,
    run_python,
    worst_case_seconds,
)

AC_SUM = SOLUTIONS["a-plus-b"][Verdict.ACCEPTED]
WA_SUM = SOLUTIONS["a-plus-b"][Verdict.WRONG_ANSWER]
SHIPPED = [(pid, verdict) for pid, by_verdict in SOLUTIONS.items() for verdict in by_verdict]


def request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


def tiny_problem(expected: str = "clean", **limits: int) -> Problem:
    return Problem(id="tiny", title="tiny", tests=[{"input": "", "expected": expected}], **limits)


# -- sandbox (no database) -----------------------------------------------------------------


@pytest.mark.parametrize(("problem_id", "verdict"), SHIPPED, ids=[f"{p}-{v.name}" for p, v in SHIPPED])
def test_every_shipped_solution_earns_its_verdict(problem_id: str, verdict: Verdict) -> None:
    problem = make_problem(problem_id)
    result = judge_submission(problem, SOLUTIONS[problem_id][verdict])
    assert result.verdict is verdict, result
    assert result.total == len(problem.tests)
    if verdict is Verdict.ACCEPTED:
        assert (result.score, result.passed) == (100, result.total)
    else:
        assert result.score < 100
    if verdict is Verdict.COMPILE_ERROR:
        assert result.details == []
        assert result.message is not None
        assert "SyntaxError" in result.message
    else:
        assert len(result.details) == result.total


def test_the_shipped_set_covers_every_verdict_and_fits_the_task_timeout() -> None:
    problems = make_problems()
    assert len(problems) >= 8
    assert {p.id for p in problems} == set(SOLUTIONS)
    assert all(Verdict.ACCEPTED in by_verdict for by_verdict in SOLUTIONS.values())
    # Every verdict a submission can earn (System Error is the judge's own failure, not the code's).
    assert {v for by_verdict in SOLUTIONS.values() for v in by_verdict} == set(Verdict) - {Verdict.SYSTEM_ERROR}
    assert all(worst_case_seconds(p) < JUDGE_TIMEOUT.total_seconds() / 2 for p in problems)
    assert all(p.tests for p in problems)


def test_partial_scores_count_passed_cases() -> None:
    result = judge_submission(make_problem("max-subarray"), SOLUTIONS["max-subarray"][Verdict.WRONG_ANSWER])
    assert (result.verdict, result.passed, result.total, result.score) == (Verdict.WRONG_ANSWER, 3, 5, 60)
    assert [d.verdict for d in result.details][:3] == [Verdict.ACCEPTED, Verdict.WRONG_ANSWER, Verdict.WRONG_ANSWER]


def test_outputs_compare_ignoring_trailing_whitespace_only() -> None:
    assert outputs_match("1 2  \n3\t\n\n\n", "1 2\n3")
    assert not outputs_match(" 1 2\n3", "1 2\n3")
    assert not outputs_match("1  2", "1 2")
    assert not outputs_match("", "0")


def test_the_sandbox_sees_no_secret_from_the_judges_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("DT_CANARY_SECRET", canary)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    run = run_python("import os\nprint(dict(os.environ))\n", "", time_limit_ms=1000, memory_limit_mb=64)
    assert run.returncode == 0, run.stderr
    assert canary not in run.stdout
    assert "DT_CANARY_SECRET" not in run.stdout
    assert "proxy" not in run.stdout.lower()
    assert ast.literal_eval(run.stdout) == SANDBOX_ENV  # nothing but the minimum
    # And through the judge: the submission can only print "clean".
    spy = "import os\nleaked = [k for k, v in os.environ.items() if 'canary' in v or 'SECRET' in k]\n"
    spy += "print('leaked' if leaked else 'clean')\n"
    assert judge_submission(tiny_problem(), spy).verdict is Verdict.ACCEPTED


def test_each_run_gets_a_fresh_empty_directory_and_limits() -> None:
    code = (
        "import os, resource\nprint(sorted(os.listdir('.')))\nprint(os.getcwd())\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0])\nopen('left-behind.txt', 'w').write('x')\n"
    )
    first = run_python(code, "", time_limit_ms=1000, memory_limit_mb=48)
    second = run_python(code, "", time_limit_ms=1000, memory_limit_mb=48)
    for run in (first, second):
        listing, cwd, address_space = run.stdout.splitlines()
        assert listing == "['solution.py']"
        assert Path(cwd) != Path.cwd()
        assert not Path(cwd).exists()  # removed afterwards
        assert int(address_space) == 48 * 1024 * 1024
    assert first.stdout.splitlines()[1] != second.stdout.splitlines()[1]


def test_processes_a_submission_leaves_behind_are_killed() -> None:
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nprint(pid)\n"
    run = run_python(code, "", time_limit_ms=1000, memory_limit_mb=64)
    assert run.returncode == 0, run.stderr
    status = Path(f"/proc/{int(run.stdout)}/status")

    def alive() -> bool:
        try:
            return "State:\tZ" not in status.read_text()  # a zombie is dead, only not yet reaped
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()


def test_a_runtime_error_reports_the_exception_type_not_the_hidden_input() -> None:
    hidden = f"hidden-{uuid.uuid4().hex}"
    problem = Problem(id="leak", title="leak", tests=[{"input": hidden + "\n", "expected": "x"}])
    result = judge_submission(problem, "raise ValueError(input())\n")
    assert (result.verdict, result.message) == (Verdict.RUNTIME_ERROR, "ValueError")
    assert hidden not in result.model_dump_json()


def test_judging_stops_between_cases_when_asked() -> None:
    asked: list[int] = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(JudgeAbortedError, match="before case 3"):
        judge_submission(make_problem("a-plus-b"), AC_SUM, should_stop=should_stop)


def test_build_app_registers_the_judge_task(tmp_path: Path) -> None:
    app = build_app(
        database_url=f"sqlite:///{tmp_path / 'j.sqlite3'}", redis_url="redis://127.0.0.1:1", data_dir=tmp_path
    )
    task = app.registry[JUDGE_TASK]
    assert (task.queue, task.max_attempts, task.timeout) == (JUDGE_QUEUE, 3, JUDGE_TIMEOUT)
    assert len(task.hooks) == 1


# -- with the runtime (SQLite and PostgreSQL, real Redis) -------------------------------------


@pytest.fixture
async def make_judge_app(make_app: Callable[..., App]) -> AsyncIterator[Callable[..., App]]:
    apps: list[App] = []

    def build(judge: JudgeFunction = judge_submission) -> App:
        app = make_app()
        install_judge(app, judge=judge)
        init_db(app)
        apps.append(app)
        return app

    yield build
    for app in apps:
        await app.aclose()


@pytest.fixture
def judge_app(make_judge_app: Callable[..., App]) -> App:
    return make_judge_app()


def submit(app: App, code: str, rid: str | None = None, problem_id: str = "a-plus-b") -> Submission:
    with Session(app.engine) as s:
        return submit_solution(app, s, problem_id, "alice", "python", code, rid or request_id())


def load(app: App, submission_id: int | None) -> Submission:
    assert submission_id is not None
    with Session(app.engine) as s:
        found = s.get(Submission, submission_id)
    assert found is not None
    return found


@pytest.mark.anyio
async def test_submit_dispatch_work_lands_the_verdict_through_the_hook(judge_app: App) -> None:
    app = judge_app
    accepted, wrong = submit(app, AC_SUM), submit(app, WA_SUM)
    assert (accepted.status, accepted.verdict, accepted.generation) == (SubmissionStatus.PENDING, None, 0)
    assert accepted.task_id is not None
    assert wrong.task_id is not None
    assert app.get_task(accepted.task_id).idempotency_key == accepted.request_id
    assert await app.dispatch_once() == 2
    assert await app.work(max_tasks=2, timeout=timedelta(seconds=30)) == 2
    for sub, verdict, score in ((accepted, Verdict.ACCEPTED, 100), (wrong, Verdict.WRONG_ANSWER, 0)):
        row = load(app, sub.id)
        assert (row.status, row.verdict, row.score, row.judged_generation) == (SubmissionStatus.DONE, verdict, score, 0)
        assert row.details is not None
        assert len(row.details) == 4
        assert row.judged_at is not None
        assert sub.task_id is not None
        info = app.get_task(sub.task_id)
        assert (info.state, info.result["verdict"]) == (TaskState.SUCCEEDED, verdict.value)
        assert [a.outcome for a in info.attempts] == ["succeeded"]


@pytest.mark.anyio
async def test_a_retried_submit_creates_no_second_submission_or_task(judge_app: App) -> None:
    app = judge_app
    rid = request_id()
    first, again = submit(app, AC_SUM, rid), submit(app, AC_SUM, rid)
    assert (again.id, again.task_id) == (first.id, first.task_id)
    with Session(app.engine) as s:
        assert s.exec(select(func.count()).where(col(Submission.request_id) == rid)).one() == 1
    assert await app.dispatch_once() == 1  # one task, one outbox row
    with pytest.raises(RequestIdReusedError), Session(app.engine) as s:
        submit_solution(app, s, "a-plus-b", "alice", "python", WA_SUM, rid)
    with pytest.raises(UnknownProblemError), Session(app.engine) as s:
        submit_solution(app, s, "no-such-problem", "alice", "python", AC_SUM, request_id())
    with pytest.raises(UnsupportedLanguageError), Session(app.engine) as s:
        submit_solution(app, s, "a-plus-b", "alice", "cobol", AC_SUM, request_id())
    assert await app.dispatch_once() == 0


@pytest.mark.anyio
async def test_a_concurrent_retry_waits_for_the_first_and_returns_it(judge_app: App) -> None:
    app = judge_app
    rid = request_id()
    # The first request is mid-transaction (its rows flushed, not committed) when the retry arrives.
    with Session(app.engine) as first:
        pending = Submission(problem_id="a-plus-b", user_id="alice", language="python", code=AC_SUM, request_id=rid)
        first.add(pending)
        first.flush()
        assert pending.id is not None
        handle = app.submit(first, JUDGE_TASK, {"submission_id": pending.id}, idempotency_key=rid)
        pending.task_id = handle.id
        first_id = pending.id

        retry: list[Submission] = []
        thread = threading.Thread(target=lambda: retry.append(submit(app, AC_SUM, rid)))
        thread.start()
        await anyio.sleep(0.3)  # the retry now blocks on the unique request_id (or on SQLite's lock)
        first.commit()
    await anyio.to_thread.run_sync(thread.join, 20)
    assert [r.id for r in retry] == [first_id]
    with Session(app.engine) as s:
        assert s.exec(select(func.count()).where(col(Submission.request_id) == rid)).one() == 1
    assert await app.dispatch_once() == 1  # one task


@pytest.mark.anyio
async def test_rejudge_while_the_old_generation_runs_lands_only_the_new_verdict(
    make_judge_app: Callable[..., App],
) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def judge(problem: Problem, code: str, *, should_stop: Callable[[], bool] | None = None) -> JudgeResult:
        calls.append(problem.id)
        if len(calls) == 1:  # generation 0: hold it until generation 1 has landed, then return a stale verdict
            started.set()
            assert release.wait(30)
            return JudgeResult(verdict=Verdict.WRONG_ANSWER, score=0, passed=0, total=4, details=[])
        return judge_submission(problem, code, should_stop=should_stop)

    app = make_judge_app(judge)
    sub = submit(app, AC_SUM)
    assert sub.task_id is not None
    assert await app.dispatch_once() == 1
    settled: list[int] = []

    async def worker() -> None:
        settled.append(await app.work(max_tasks=2, timeout=timedelta(seconds=40)))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            assert await anyio.to_thread.run_sync(started.wait, 20)
            assert load(app, sub.id).status == SubmissionStatus.JUDGING
            with Session(app.engine) as s:
                rejudged = rejudge(app, s, sub.id)  # type: ignore[arg-type]
            assert (rejudged.generation, rejudged.status) == (1, SubmissionStatus.PENDING)
            assert await app.dispatch_once() == 1
            with anyio.fail_after(30):
                while load(app, sub.id).judged_generation != 1:
                    await anyio.sleep(0.05)
            release.set()  # now the stale generation-0 result tries to commit
    finally:
        release.set()
    assert settled == [2]
    row = load(app, sub.id)
    assert (row.status, row.verdict, row.score) == (SubmissionStatus.DONE, Verdict.ACCEPTED, 100)
    assert (row.generation, row.judged_generation) == (1, 1)
    info = app.get_task(sub.task_id)
    assert (info.state, info.generation, info.result["verdict"]) == (TaskState.SUCCEEDED, 1, "Accepted")
    assert [(a.generation, a.outcome) for a in info.attempts] == [(0, "fenced_out"), (1, "succeeded")]


@pytest.mark.anyio
async def test_the_http_api_submits_idempotently_reads_and_rejudges(judge_app: App) -> None:
    app = judge_app
    client = TestClient(create_api(app))
    assert len(client.get("/problems").json()) == len(PROBLEM_SPECS)
    body: dict[str, Any] = {
        "problem_id": "a-plus-b",
        "user_id": "bob",
        "language": "python",
        "code": AC_SUM,
        "request_id": request_id(),
    }
    created = client.post("/submissions", json=body)
    assert created.status_code == 201, created.text
    sub = created.json()
    assert (sub["status"], sub["verdict"], sub["generation"]) == ("Pending", None, 0)
    retried = client.post("/submissions", json=body)
    assert (retried.status_code, retried.json()["id"], retried.json()["task_id"]) == (201, sub["id"], sub["task_id"])
    assert client.post("/submissions", json=body | {"code": WA_SUM}).status_code == 409
    unknown_problem = body | {"problem_id": "nope", "request_id": request_id()}
    assert client.post("/submissions", json=unknown_problem).status_code == 404
    bad_language = body | {"language": "cobol", "request_id": request_id()}
    assert client.post("/submissions", json=bad_language).status_code == 422
    assert client.post("/submissions", json={k: v for k, v in body.items() if k != "code"}).status_code == 422
    assert client.get("/submissions/999999999").status_code == 404
    assert client.post("/submissions/999999999/rejudge").status_code == 404

    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=30)) == 1
    judged = client.get(f"/submissions/{sub['id']}").json()
    assert (judged["status"], judged["verdict"], judged["score"], judged["judged_generation"]) == (
        "Done",
        "Accepted",
        100,
        0,
    )
    assert "code" not in judged

    again = client.post(f"/submissions/{sub['id']}/rejudge")
    assert again.status_code == 202
    assert (again.json()["status"], again.json()["generation"]) == ("Pending", 1)
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=30)) == 1
    rejudged = client.get(f"/submissions/{sub['id']}").json()
    assert (rejudged["status"], rejudged["verdict"], rejudged["generation"], rejudged["judged_generation"]) == (
        "Done",
        "Accepted",
        1,
        1,
    )
    assert json.loads(json.dumps(rejudged["details"]))[0]["verdict"] == "Accepted"


def test_examples_import_only_the_public_api() -> None:
    root = Path(__file__).resolve().parents[2] / "examples" / "judge"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module == "durable_tasks" or not node.module.startswith("durable_tasks"), path
            if isinstance(node, ast.Import):
                assert all(not a.name.startswith("durable_tasks.") for a in node.names), path


@pytest.mark.anyio
async def test_a_judge_that_keeps_failing_records_a_system_error(make_judge_app: Callable[..., App]) -> None:
    def broken(problem: Problem, code: str, *, should_stop: Callable[[], bool] | None = None) -> JudgeResult:
        raise OSError("sandbox host out of disk")

    app = make_judge_app(broken)
    sub = submit(app, AC_SUM)
    for _ in range(3):  # max_attempts=3
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    row = load(app, sub.id)
    assert (row.status, row.verdict, row.score) == (SubmissionStatus.DONE, Verdict.SYSTEM_ERROR, 0)
