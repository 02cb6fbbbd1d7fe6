"""Operator tooling against real servers: status --watch, tasks show, dlq, doctor."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session
from typer.testing import CliRunner

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks.cli import cli
from durable_tasks.clock import system_clock
from durable_tasks.doctor import Facts, Level, check_version, diagnose, gather_facts
from durable_tasks.records import outbox_table
from tests.helpers import die_running_alone, entries, outlive_lease, submit
from tests.servers import private_redis

APP = "tests.apps.cli_app:app"
pytestmark = pytest.mark.anyio


@pytest.fixture
def env(cli_app_env: Callable[..., dict[str, str]]) -> Iterator[dict[str, str]]:
    yield cli_app_env(DT_LEASE_TIMEOUT="0.5", DT_HEARTBEAT_INTERVAL="0.1", DT_MAX_DELIVERIES="1", DT_READ_BLOCK="0.1")
    sys.modules.pop("tests.apps.cli_app", None)


def the_app() -> App:
    from tests.apps.cli_app import app

    app.create_all()
    return app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


async def dead_letter_one(app: App) -> str:
    """Submit, deliver to a worker that dies running it alone, reap with max_deliveries=1."""
    app.clock = FrozenClock()  # the lease runs out when the test moves the clock, not by waiting
    task_id = submit(app, "cli.nap", {"seconds": 0})
    await app.dispatch_once()
    [entry] = await app.runtime.transport().read(["cli"], "doomed-consumer", count=1, block=timedelta(milliseconds=100))
    await die_running_alone(app, entry, "doomed-consumer")
    await outlive_lease(app)  # past lease_timeout (0.5 s): the entry is idle and nobody holds it
    report = await app.reap_once()
    assert report.dead_lettered == 1
    await app.aclose()
    app.clock = system_clock
    return task_id


def test_status_watch_refreshes(env: dict[str, str]) -> None:
    the_app()
    code, out = invoke("status", APP, "--watch", "--interval", "0.1", "--count", "2")
    assert code == 0, out
    assert out.count("durable_tasks · namespace") >= 1
    assert "stream_lag" in out


def test_tasks_show_lists_every_attempt_with_its_reason(env: dict[str, str]) -> None:
    app = the_app()
    task_id = run_one(app, "cli.nap", {"seconds": 0})
    code, out = invoke("tasks", "show", APP, task_id)
    assert code == 0, out
    assert "SUCCEEDED" in out
    assert "succeeded" in out
    code, by_option = invoke("tasks", "show", task_id, "--app", APP)
    assert code == 0, by_option
    assert "succeeded" in by_option
    named = CliRunner().invoke(cli, ["tasks", "show", task_id], env={"DT_APP": APP, "COLUMNS": "250"})
    assert named.exit_code == 0, named.output  # `durable-tasks tasks show ID` with DT_APP set
    assert "succeeded" in named.output
    code, out = invoke("tasks", "show", "no-such-task", "--app", APP)
    assert code == 2
    assert "no task" in out


def run_one(app: App, task: str, payload: dict[str, Any]) -> str:
    """Submit ``task`` and run its one delivery to its end (one dispatch pass, one worker
    settling one task); its id."""
    task_id = submit(app, task, payload)

    async def run() -> None:
        await app.dispatch_once()
        await app.work(max_tasks=1, timeout=timedelta(seconds=10))
        await app.aclose()

    anyio.run(run)
    return task_id


def run_until_failed(app: App) -> str:
    """Submit ``cli.fail`` (one attempt) and run it until it is FAILED."""
    task_id = run_one(app, "cli.fail", {"seconds": 7})
    assert app.get_task(task_id).state == TaskState.FAILED
    return task_id


def test_a_failed_task_is_counted_listed_and_shown_with_its_traceback(env: dict[str, str]) -> None:
    app = the_app()
    task_id = run_until_failed(app)
    code, out = invoke("status", APP)
    assert code == 0, out
    header, row = (line.split() for line in out.splitlines()[1:3])
    assert dict(zip(header, row, strict=True))["failed"] == "1"

    code, out = invoke("tasks", "list", APP, "--state", "FAILED")
    assert code == 0, out
    assert task_id in out
    assert "ValueError: cannot nap 7" in out
    code, out = invoke("tasks", "list", APP, "--state", "failed", "--name", "cli.fail", "--since", "1h", "--json")
    assert code == 0, out
    assert [json.loads(line)["id"] for line in out.splitlines()] == [task_id]

    code, out = invoke("tasks", "show", APP, task_id)
    assert code == 0, out
    assert "ValueError: cannot nap 7" in out
    assert "Traceback (most recent call last)" in out  # dt_attempts.traceback
    assert 'raise ValueError(f"cannot nap' in out
    code, out = invoke("tasks", "show", APP, task_id, "--json")
    assert json.loads(out)["attempts"][0]["error_message"] == "cannot nap 7.0 s"


def test_read_commands_piped_at_80_columns_print_whole_headers_and_cells(env: dict[str, str]) -> None:
    app = the_app()
    task_id = run_until_failed(app)
    for argv, must in [
        (["status", APP], ["outbox_oldest_age_s", "oldest_pending_age_s", "unknown_held", "failed", "dead"]),
        (["tasks", "list", APP], [task_id, "ValueError: cannot nap 7.0 s", "created"]),
        (["tasks", "show", APP, task_id], ["generation", "delivery", "outcome", "ValueError: cannot nap 7.0 s"]),
        (["doctor", APP], ["maxmemory-policy", "clock-skew"]),
    ]:
        result = CliRunner().invoke(cli, argv, env={"COLUMNS": "80"})  # CliRunner's output is not a terminal
        assert result.exit_code in (0, 1), result.output  # doctor exits 1 on an error-level finding
        assert "…" not in result.output, argv
        for text in must:
            assert text in result.output, (argv, text)


def test_tasks_rerun_and_cancel_by_id_or_by_filter_with_yes(env: dict[str, str]) -> None:
    app = the_app()
    first, second = run_until_failed(app), run_until_failed(app)
    code, out = invoke("tasks", "rerun", APP, "--state", "FAILED")
    assert code == 2, out  # not a terminal: no prompt to answer
    assert "2 task(s) match: pass --yes" in out
    assert app.get_task(first).generation == 0

    code, out = invoke("tasks", "rerun", APP, "--state", "FAILED", "--name", "cli.fail", "--yes")
    assert code == 0, out
    assert "rerun 2 task(s)" in out
    assert {app.get_task(t).generation for t in (first, second)} == {1}

    code, out = invoke("tasks", "cancel", first, second, "--app", APP)
    assert code == 0, out
    assert "cancelled 2 task(s)" in out
    assert {app.get_task(t).state for t in (first, second)} == {TaskState.CANCELLED}
    code, out = invoke("tasks", "cancel", APP, first)
    assert code == 0, out
    assert "already final, left alone" in out
    code, out = invoke("tasks", "rerun", APP, "no-such-task")
    assert code == 2, out
    assert "no task 'no-such-task'" in out


def test_dlq_list_show_replay_and_purge(env: dict[str, str]) -> None:
    app = the_app()
    task_id = anyio.run(dead_letter_one, app)
    code, out = invoke("dlq", "list", APP, "cli")
    assert code == 0, out
    assert task_id in out
    assert "max_deliveries" in out
    entry = next(line.split()[0] for line in out.splitlines() if task_id in line)  # plain columns when piped
    code, out = invoke("dlq", "show", APP, "cli", entry)
    assert code == 0, out
    assert "DEAD" in out
    code, out = invoke("status", APP, "--json")
    assert code == 0, out
    assert json.loads(out)["queues"]["cli"]["dead"] == 1  # a task the reaper dead-lettered
    code, out = invoke("dlq", "list", APP, "cli", "--json")
    assert [json.loads(line)["task_id"] for line in out.splitlines()] == [task_id]
    code, out = invoke("dlq", "show", APP, "cli", entry, "--json")
    assert code == 0, out
    assert json.loads(out)["task"]["state"] == "DEAD"

    code, out = invoke("dlq", "replay", "cli", "--app", APP)
    assert code == 0, out
    assert "replayed 1 task" in out
    info = app.get_task(task_id)
    assert (info.state, info.generation) == (TaskState.PENDING, 1)  # a new generation, via the outbox

    async def finish() -> None:
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
        await app.aclose()

    anyio.run(finish)
    assert app.get_task(task_id).state == TaskState.SUCCEEDED
    code, out = invoke("dlq", "list", "cli", "--app", APP)
    assert task_id not in out

    anyio.run(dead_letter_one, app)
    code, out = invoke("dlq", "purge", "cli", "--app", APP)
    assert code == 0, out
    assert "purged 1 entry" in out


async def dlq_length(app: App, queue: str) -> int:
    transport = app.runtime.transport()
    length = int(await transport.client.xlen(transport.keys(queue).dlq))
    await app.aclose()
    return length


def test_a_dead_task_rerun_leaves_the_dlq(env: dict[str, str]) -> None:
    app = the_app()
    by_cli = anyio.run(dead_letter_one, app)
    by_app = anyio.run(dead_letter_one, app)
    kept = anyio.run(dead_letter_one, app)
    assert anyio.run(dlq_length, app, "cli") == 3

    code, out = invoke("tasks", "rerun", APP, by_cli)
    assert code == 0, out
    code, out = invoke("dlq", "list", APP, "cli", "--json")  # read: the rerun task's entry goes
    assert [json.loads(line)["task_id"] for line in out.splitlines()] == [by_app, kept]
    assert anyio.run(dlq_length, app, "cli") == 2

    with Session(app.engine) as session:
        app.rerun(session, by_app)
        session.commit()

    async def reap() -> int:
        report = await app.reap_once()  # nobody reads the DLQ: the reaper's pass deletes the entry
        await app.aclose()
        return report.forgotten_dead_letters

    assert anyio.run(reap) == 1
    assert anyio.run(dlq_length, app, "cli") == 1  # the task still DEAD keeps its entry
    code, out = invoke("dlq", "list", APP, "cli", "--json")
    assert [json.loads(line)["task_id"] for line in out.splitlines()] == [kept]


def test_doctor_fails_on_a_badly_configured_server(env: dict[str, str], tmp_path: Path) -> None:
    with private_redis(tmp_path / "bad", "--maxmemory-policy", "allkeys-lru", "--appendonly", "no") as server:
        os.environ["DT_REDIS_URL"] = server.url
        sys.modules.pop("tests.apps.cli_app", None)
        code, out = invoke("doctor", APP)
    assert code == 1, out
    assert "allkeys-lru" in out
    assert "persists nothing" in out


def test_doctor_passes_on_a_well_configured_server(env: dict[str, str], tmp_path: Path) -> None:
    with private_redis(tmp_path / "good", "--maxmemory-policy", "noeviction", "--appendonly", "yes") as server:
        os.environ["DT_REDIS_URL"] = server.url
        sys.modules.pop("tests.apps.cli_app", None)
        assert invoke("init-db", APP)[0] == 0
        code, out = invoke("doctor", APP)
        code_json, out_json = invoke("doctor", APP, "--json")
    assert code == 0, out
    assert "no drift" in out
    assert code_json == 0, out_json
    findings = {f["check"]: f for f in map(json.loads, out_json.splitlines())}
    assert findings["schema"]["level"] == "ok"
    assert "no drift" in findings["schema"]["message"]


async def test_doctor_checks_clock_skew_groups_trimming_and_timeouts(
    make_app: Callable[..., App], tmp_path: Path
) -> None:
    skewed = make_app(visibility_timeout=timedelta(minutes=1))
    skewed.clock = lambda: system_clock() + timedelta(seconds=30)

    @skewed.task(name="slowpoke", queue="doc", timeout=timedelta(minutes=5))
    def slowpoke(ctx: TaskContext[int], n: int) -> int:
        return n

    client = skewed.runtime.transport().client
    stream = skewed.runtime.transport().keys("doc").stream
    for i in range(30):
        await client.xadd(stream, {"i": str(i)})  # a stream no group reads
    facts = await gather_facts(skewed, untrimmed_threshold=10)
    by_check = {f.check: f for f in diagnose(facts)}
    assert by_check["clock-skew"].level is Level.ERROR
    assert by_check["consumer-group"].level is Level.WARNING
    assert stream in by_check["consumer-group"].message
    assert by_check["timeouts"].level is Level.ERROR
    await skewed.runtime.transport().ensure_group(stream)
    await client.xreadgroup("dt-workers", "c", {stream: ">"}, count=30)
    await client.xack(stream, "dt-workers", *[entry_id for entry_id, _ in await entries(skewed, stream)])
    facts = await gather_facts(skewed, untrimmed_threshold=10)
    assert {f.check: f for f in diagnose(facts)}["trimming"].level is Level.WARNING
    await skewed.aclose()


def test_version_floor_and_dedup_ttl_are_errors(make_app: Callable[..., App]) -> None:
    app = make_app(visibility_timeout=timedelta(hours=24))
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    facts = Facts(app.settings, {"redis_version": "6.2.14"}, {}, now, now, None)
    assert check_version(facts).level is Level.ERROR
    assert {f.check: f for f in diagnose(facts)}["dedup-ttl"].level is Level.ERROR


def missing_indexes(app: App) -> list[str]:
    return anyio.run(app.runtime.store.facts).indexes_missing


def test_doctor_names_an_index_an_older_database_lacks_with_its_create_statement(
    make_app: Callable[..., App],
) -> None:
    app = make_app()
    assert missing_indexes(app) == []
    # The index of PENDING outbox rows: partial where the database has partial indexes.
    mysql = app.engine.dialect.name == "mysql"
    name, columns = (
        ("ix_dt_outbox_state_due", "namespace, state, next_attempt_at, id")
        if mysql
        else ("ix_dt_outbox_pending_due", "namespace, next_attempt_at, id")
    )
    [index] = [i for i in outbox_table.indexes if i.name == name]
    with app.engine.begin() as conn:
        conn.execute(sa.schema.DropIndex(index))
    try:
        [statement] = missing_indexes(app)
        assert statement.startswith(f"CREATE INDEX {name} ON dt_outbox ({columns})")
        assert mysql or "state = 'PENDING'" in statement
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        facts = Facts(app.settings, {"redis_version": "7.2.0"}, {}, now, now, None, indexes_missing=[statement])
        finding = {f.check: f for f in diagnose(facts)}["indexes"]
        assert finding.level is Level.WARNING
        assert statement in finding.message
        with app.engine.begin() as conn:
            conn.execute(sa.text(statement))  # the statement doctor prints repairs the database
        assert missing_indexes(app) == []
    finally:
        if missing_indexes(app):
            with app.engine.begin() as conn:
                conn.execute(sa.text(missing_indexes(app)[0]))
