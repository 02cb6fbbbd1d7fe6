"""The hot Postgres statements look dt_tasks rows up by primary key, whatever the statistics say.

A queue table's statistics are always stale: ANALYZE saw the rows PENDING, and a moment
later thousands are RUNNING. The claim, group-commit, lease-renewal and mark statements once tested
``state`` where the planner could answer it from ix_dt_tasks_state; believing RUNNING rare,
it scanned every RUNNING row once per result (458 ms for a 300-row commit beside 3,300
running tasks). These tests recreate that staleness and read the plans (EXPLAIN without
ANALYZE: nothing is executed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext, readmodel
from durable_tasks.agents import ScriptedModel
from durable_tasks.journal import ChildOutcome
from durable_tasks.records import tasks_table
from durable_tasks.store import queries, recovery, sql
from durable_tasks.store.execution import ExecutionClaim
from durable_tasks.store.journal import child_task
from durable_tasks.store.payloads import INLINE_PAYLOAD_BYTES
from durable_tasks.store.pooler import PathProbe, Pooling, PoolingReport
from durable_tasks.store.postgres import PostgresStore, statements, submits
from durable_tasks.store.postgres.connections import AsyncConnections
from durable_tasks.store.postgres.statements import OneStatement
from durable_tasks.store.results import FinalWrite
from tests.helpers import first_attempt, private_schema
from tests.integration.test_agents import build, script
from tests.integration.test_suspend_store import pending_child

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def runtime_engine(app: App) -> sa.Engine:
    """The pool as the runtime plans on it (sequential scans priced out)."""
    store = app.runtime.store
    assert isinstance(store, PostgresStore)
    return store.runtime_engine


def plan_of(app: App, name: str, params: dict[str, Any], *, engine: sa.Engine | None = None) -> list[dict[str, Any]]:
    with (engine or app.engine).connect() as conn:
        (doc,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql.postgres()[name], params).scalar_one()
    return list(nodes(doc["Plan"]))


def statement_params(name: str, namespace: str, now: datetime, ids: list[str]) -> dict[str, Any]:
    """A hot statement's parameters for the tasks ``ids`` (generation 0, delivery 0, first
    attempt; mark_sent with one outbox row), shaped as the runtime sends them."""
    n, later = len(ids), now + timedelta(seconds=30)
    common = {"namespace": namespace, "now": now}
    return {
        "claim_outbox": {
            "namespaces": [namespace],
            "now": now,
            "lease_until": later,
            "token": "t",
            "limit": 500,
            "watermark": 0,
            "inline_payload": INLINE_PAYLOAD_BYTES,
        },
        "mark_sent": common
        | {
            "ids": [1],
            "tokens": ["t"],
            "stream_ids": ["1-0"],
            "partitions": [0],
            "task_ids": ids,
            "generations": [0] * n,
            "deliveries": [0] * n,
        },
        "claim_executions": common
        | {
            "ids": ids,
            "generations": [0] * n,
            "deliveries": [0] * n,
            "trace_ids": [],
            "traceparents": [],
            "lease_until": later,
            "worker_id": "w",
            "inline_payload": INLINE_PAYLOAD_BYTES,
            "hold": False,
        },
        "commit_results": common
        | {"ids": ids, "parent_ids": [], "generations": [0] * n, "attempts": [1] * n, "results": ["null"] * n},
        "renew_leases": common | {"ids": ids, "generations": [0] * n, "attempts": [1] * n, "lease_until": later},
    }[name]


def stale_statistics(app: App, n: int, running: int) -> tuple[list[str], list[str]]:
    """n tasks analyzed while PENDING, then ``running`` of them RUNNING and the rest ENQUEUED
    (as a busy worker leaves them): returns (running ids, enqueued ids). Each task has an
    earlier attempt and a journal row, analyzed too: ``dt_attempts`` and ``dt_steps`` are as
    large as a runtime's, whether or not autovacuum has looked at them (an empty table that
    was analyzed is scanned in sequence, at the cost of an index probe)."""

    @app.task(name="noop", queue="jobs")
    def noop(ctx: TaskContext[int], p: int) -> int:
        return p

    with Session(app.engine) as s:
        ids = sorted(noop.submit(s, i).id for i in range(n))
        s.commit()
    with app.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO dt_attempts (namespace, task_id, generation, attempt, delivery, worker_id, started_at,"
            " finished_at, outcome) SELECT namespace, id, generation - 1, 1, 0, 'w', created_at, created_at,"
            " 'succeeded' FROM dt_tasks WHERE id = ANY(%(ids)s::text[])",
            {"ids": ids},
        )
        conn.exec_driver_sql(
            "INSERT INTO dt_steps (namespace, task_id, generation, slot, kind, label, done, created_at)"
            " SELECT namespace, id, generation - 1, 'step:0', 'step', 'step', true, created_at"
            " FROM dt_tasks WHERE id = ANY(%(ids)s::text[])",
            {"ids": ids},
        )
        conn.exec_driver_sql("ANALYZE dt_tasks, dt_attempts, dt_steps")
    with app.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE dt_tasks SET state = 'RUNNING', attempt = 1 WHERE id = ANY(%(ids)s::text[])",
            {"ids": ids[:running]},
        )
        conn.exec_driver_sql(
            "UPDATE dt_tasks SET state = 'ENQUEUED' WHERE id = ANY(%(ids)s::text[])", {"ids": ids[running:]}
        )
    return ids[:running], ids[running:]


def test_hot_statements_never_scan_by_state_with_stale_statistics(make_app: Callable[..., App]) -> None:
    app = make_app()
    running, enqueued = stale_statistics(app, 4000, running=3000)
    now, ns = app.clock(), app.settings.namespace
    batch = running[::15]  # 200 results among 3,000 running tasks
    plans = {
        name: plan_of(app, name, statement_params(name, ns, now, ids))
        for name, ids in {
            "commit_results": batch,
            "claim_executions": enqueued[:200],
            "renew_leases": running[:1000],
            "mark_sent": enqueued[:200],
        }.items()
    }
    for name, plan in plans.items():
        by_state = [node for node in plan if node.get("Index Name") == "ix_dt_tasks_state"]
        assert not by_state, f"{name} scans dt_tasks by state: {by_state}"
        # and the batch's rows are found by primary key (or, on a table this small, a scan of
        # it): never through the state index, which is all the planner had besides
        task_scans = [node for node in plan if node.get("Relation Name") == "dt_tasks"]
        assert task_scans, f"{name} reads no dt_tasks rows?"
        assert all(node.get("Index Name") in (None, "dt_tasks_pkey") for node in task_scans), (name, task_scans)


def test_the_outbox_claim_reads_the_pending_index_after_a_backlog_was_analyzed(make_app: Callable[..., App]) -> None:
    """ANALYZE saw a backlog (every outbox row PENDING); then most rows were SENT. Matching the
    namespace by plain equality, the planner walked the primary key in id order past every
    SENT row on each claim (a cost that grows as the backlog drains: quadratic over a drain),
    and looked the leased rows up with a scan of the whole outbox. The claim must read
    ix_dt_outbox_pending_due (only PENDING rows) and find the leased rows by id. Planned as the
    runtime plans it (sequential scans priced out: the store's runtime engine), where a walk of
    the primary key, an index scan, is still possible."""
    app = make_app()
    ns = app.settings.namespace
    with app.engine.begin() as conn:  # the plan is read, never run: the rows need no tasks
        conn.exec_driver_sql(
            "INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts,"
            " next_attempt_at, shadow, created_at)"
            " SELECT %(ns)s, 'task-' || g, 'jobs', 0, 0, 'PENDING', 0, now(), false, now()"
            " FROM generate_series(1, 20000) AS g",
            {"ns": ns},
        )
        conn.exec_driver_sql("ANALYZE dt_outbox")
        conn.exec_driver_sql(
            "UPDATE dt_outbox SET state = 'SENT' WHERE id IN"
            " (SELECT id FROM dt_outbox WHERE namespace = %(ns)s ORDER BY id LIMIT 15000)",
            {"ns": ns},
        )
    params = statement_params("claim_outbox", ns, app.clock(), [])
    plan = plan_of(app, "claim_outbox", params, engine=runtime_engine(app))
    due = [node.get("Index Name") for node in plan if node.get("Alias") == "d" and node["Node Type"].endswith("Scan")]
    assert due == ["ix_dt_outbox_pending_due"], due
    leased = [node["Node Type"] for node in plan if node.get("Alias") == "o" and node["Node Type"].endswith("Scan")]
    assert leased == ["Index Scan"], leased


def test_delayed_rows_cost_the_claim_and_the_wake_up_nothing_until_due(empty_tables: App) -> None:
    """20,000 rows due in three days and 50 due now, statistics taken: the claim's selection
    reads the 50 due entries of ix_dt_outbox_pending_due and stops (in id order it walked past
    every delayed row on each pass), and the next-due probe (alone, or the one the claim
    carries) reads one entry. Run for real
    (EXPLAIN ANALYZE), as the runtime plans it, in a transaction that is rolled back, on tables
    of its own: the statistics are of these rows alone, not of whatever the tests running
    beside it left in the shared tables at that moment (under make test's four processes, the
    planner once chose a bitmap scan from those)."""
    app = empty_tables
    ns, now = app.settings.namespace, app.clock()
    with runtime_engine(app).connect() as conn, conn.begin():
        conn.exec_driver_sql(
            "INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts,"
            " next_attempt_at, shadow, created_at)"
            " SELECT %(ns)s, 'task-' || g, 'jobs', 0, 0, 'PENDING', 0,"
            "        CASE WHEN g <= 20000 THEN %(later)s ELSE %(now)s END, false, %(now)s"
            " FROM generate_series(1, 20050) AS g",
            {"ns": ns, "now": now, "later": now + timedelta(days=3)},
        )
        conn.exec_driver_sql("ANALYZE dt_outbox")
        # the claim's selection (d) and the next-due probe it carries (w); the probe alone (d)
        for name, alias, read in (("claim_outbox", "d", 50), ("claim_outbox", "w", 1), ("next_due", "d", 1)):
            params = statement_params("claim_outbox", ns, now, []) | {"namespaces": [ns], "now": now}
            (doc,) = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.postgres()[name], params).scalar_one()
            scans = [n for n in nodes(doc["Plan"]) if n.get("Alias") == alias and n["Node Type"].endswith("Scan")]
            assert [n.get("Index Name") for n in scans] == ["ix_dt_outbox_pending_due"], (name, alias, scans)
            assert scans[0]["Actual Rows"] == read, (name, alias, scans[0])
            assert scans[0].get("Rows Removed by Filter", 0) == 0, (name, alias, scans[0])
        conn.rollback()


@pytest.fixture
def empty_tables(database_url: str, tmp_path: Path) -> Iterator[App]:
    """An App on a schema of its own whose tables were just created (nothing in them, never
    analyzed): what a new deployment's processes plan their statements against."""
    with private_schema(database_url, "dt_empty") as url:
        app = App(url, "redis://127.0.0.1:1/0", "plans", data_dir=tmp_path)  # Redis: never used here
        try:
            app.create_all()
            yield app
        finally:
            app.engine.dispose()


class ProbeSaying(PathProbe):
    """A probe that reports what it is told (the path through a pooler, on a direct server)."""

    def __init__(self, pooling: Pooling) -> None:
        super().__init__("")
        self.pooling = pooling

    def report(self) -> PoolingReport:
        return PoolingReport(self.pooling, "told")


@pytest.mark.anyio
@pytest.mark.parametrize("pooling", [Pooling.DIRECT, Pooling.TRANSACTION, Pooling.SESSION])
async def test_the_runtime_connections_plan_the_hot_statements_by_key_on_empty_tables(
    empty_tables: App, pooling: Pooling
) -> None:
    """A prepared statement keeps the generic plan it got when it was prepared. Planned while
    the tables were small, the lease and the mark-SENT scanned all of dt_outbox and dt_tasks on
    every pass as they grew (docs/performance.md, "Why it is built this way"). On the loops' own connections
    no hot statement may plan a sequential scan of a runtime table, even on tables that are
    empty and were never analyzed; the application's pool keeps its own planner settings. On a
    direct connection the setting is the session's; through a pooler it travels with each
    statement, and does not stay on the server connection."""
    app = empty_tables
    now, ids = app.clock(), [f"task-{i}" for i in range(3)]
    names = ("claim_outbox", "mark_sent", "claim_executions", "commit_results", "renew_leases")
    ours = {"dt_tasks", "dt_outbox", "dt_attempts"}
    connections = AsyncConnections(app.engine, probe=ProbeSaying(pooling))
    try:
        for name in names:
            params = statement_params(name, "plans", now, ids)
            explain = OneStatement("EXPLAIN (FORMAT JSON) " + sql.postgres()[name], params, lambda r: r[0][0])
            plan = list(nodes((await connections.run(explain))[0]["Plan"]))
            scanned = {node.get("Relation Name") for node in plan} & ours
            assert scanned, f"{name} reads none of the runtime's tables?"
            seq = [node["Relation Name"] for node in plan if node["Node Type"] == "Seq Scan"]
            assert not seq, f"{name} plans a sequential scan of {seq} on the runtime's connection"
        if pooling is not Pooling.DIRECT:  # nothing stayed on the connection after the statement
            show = OneStatement("SELECT current_setting('enable_seqscan')", {}, lambda r: r[0][0])
            assert await connections.run(show) == "off"  # in the statement's own transaction
            async with connections._idle[-1][0].cursor() as cursor:
                await cursor.execute("SHOW enable_seqscan")
                assert await cursor.fetchone() == ("on",)
    finally:
        connections.close()
    with app.engine.connect() as conn:  # the application's pool: untouched
        assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "on"


def test_the_runtimes_transactions_on_the_shared_pool_price_sequential_scans_out_for_themselves_only(
    make_app: Callable[..., App],
) -> None:
    """Heartbeats and the reaper's reads run on the application's pool: each of their
    transactions starts with SET LOCAL enable_seqscan = off, and a transaction of the
    application on the same pooled connection right after still plans as it always did."""
    app = make_app()
    store = app.runtime.store
    assert isinstance(store, PostgresStore)
    app.engine.dispose()
    pids: set[int] = set()
    for _ in range(2):
        with store.runtime_engine.connect() as conn:
            pids.add(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "off"
            conn.commit()
            assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "off"  # the next one too
        with app.engine.connect() as conn:
            pids.add(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "on"
    assert len(pids) == 1  # one pooled connection served both kinds: the setting did not stay
    assert store.runtime_engine is store.runtime_engine  # one view per engine, not one per call


def test_a_reconciler_page_reads_the_sent_tasks_from_its_cursor_by_index(empty_tables: App) -> None:
    """The reconciler's walk (recovery.unconfirmed_deliveries after a cursor) reads
    ix_dt_tasks_sent from the cursor on, in (enqueued_at, id) order: no sort of every sent task,
    no scan of the finished ones. Planned as the runtime plans it, statistics taken with most
    tasks finished, on tables of its own (statistics of these rows alone). The generic plan (a
    prepared statement's) too: it knows no parameter's value."""
    app = empty_tables
    _, sent = stale_statistics(app, 4000, running=0)
    ns, now = app.settings.namespace, app.clock()
    with app.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE dt_tasks SET state = CASE WHEN id = ANY(%(finished)s::text[]) THEN 'SUCCEEDED' ELSE state END,"
            " enqueued_at = %(at)s WHERE id = ANY(%(ids)s::text[])",
            {"finished": sent[:3000], "ids": sent, "at": now - timedelta(hours=1)},
        )
        conn.exec_driver_sql(
            "UPDATE dt_outbox SET state = 'SENT', stream_id = '1-0' WHERE namespace = %(ns)s", {"ns": ns}
        )
        conn.exec_driver_sql("ANALYZE dt_tasks")
        conn.exec_driver_sql("ANALYZE dt_outbox")
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        statements.append((statement, params))

    engine = runtime_engine(app)
    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        with engine.connect() as conn:
            page = recovery.unconfirmed_deliveries(
                conn, ns, now=now, grace=timedelta(seconds=30), limit=500, after=(now - timedelta(hours=1), sent[3100])
            )
            assert len(page.deliveries) == 500  # sent[3101:3601]: a full page, in (enqueued_at, id) order
            assert [d.task_id for d in page.deliveries] == sorted(sent[3000:])[101:601]
            (statement, params) = statements[-1]
            # the plan psycopg's prepared statement keeps, made without the parameters' values
            conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            (doc,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).scalar_one()
            conn.rollback()
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    plan = list(nodes(doc["Plan"]))
    scans = [n for n in plan if n.get("Relation Name") == "dt_tasks"]
    assert [n.get("Index Name") for n in scans] == ["ix_dt_tasks_sent"], scans
    assert "enqueued_at" in scans[0].get("Index Cond", ""), scans[0]
    assert not [n for n in plan if n["Node Type"] in ("Sort", "Incremental Sort")], plan


def generic_plan(conn: sa.Connection, statement: str, params: dict[str, Any]) -> dict[str, Any]:
    """The plan a prepared statement keeps once PostgreSQL stops planning it per call (the
    generic plan: made without the parameters' values, each array guessed at ten elements)."""
    order: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    conn.exec_driver_sql("PREPARE dt_generic AS " + re.sub(r"%\((\w+)\)[sb]", numbered, statement))
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    types = conn.exec_driver_sql(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'dt_generic'"
    ).scalar_one()
    arguments = ", ".join(f"%({name})s::{type_}" for name, type_ in zip(order, types, strict=True))
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    with psycopg.ClientCursor(driver) as cursor:  # EXECUTE's arguments take no server-side parameters
        cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE dt_generic({arguments})", {k: params[k] for k in order})
        row = cursor.fetchone()
    conn.exec_driver_sql("DEALLOCATE dt_generic")
    assert row is not None
    return dict(row[0][0]["Plan"])


def test_a_row_by_row_generic_plan_probes_each_row_by_its_key_not_against_the_whole_batch(
    empty_tables: App,
) -> None:
    """A prepared statement's generic plan guesses every array at ten elements, so it often
    joins a batch row by row (a nested loop). A probe that also tests ``key = ANY(ids)`` sorts
    and searches the whole array again for every row: the group commit closing 512 attempts
    that way took 100-130 ms instead of 4-8, a quarter of the worker's turnaround with 10,000
    tasks in flight. With nested loops the only join left (hash and merge joins priced out), the
    generic plan of each prepared hot statement probes each row by its own key alone; the group
    commit, which finds its rows by the array, is never prepared (next test)."""
    app = empty_tables
    running, enqueued = stale_statistics(app, 2000, running=1500)
    ns, now = app.settings.namespace, app.clock()
    with runtime_engine(app).connect() as conn, conn.begin():
        conn.exec_driver_sql("SET LOCAL enable_hashjoin = off")
        conn.exec_driver_sql("SET LOCAL enable_mergejoin = off")
        for name, ids in {
            "claim_executions": enqueued[:500],
            "renew_leases": running[:500],
            "mark_sent": enqueued[:500],
        }.items():
            plan = generic_plan(conn, sql.postgres()[name], statement_params(name, ns, now, ids))
            whole_batch = [probe for probe in row_by_row_probes(plan) if "ANY" in scan_conditions(probe)]
            assert not whole_batch, f"{name}: a per-row probe tests the whole array: {whole_batch}"
        # the group commit's generic plan would: hence it is planned per call
        plan = generic_plan(
            conn, sql.postgres()["commit_results"], statement_params("commit_results", ns, now, running)
        )
        assert [probe for probe in row_by_row_probes(plan) if "ANY" in scan_conditions(probe)]
        conn.rollback()


def row_by_row_probes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The scans a nested loop runs once per outer row."""
    return [
        child
        for loop in nodes(plan)
        if loop["Node Type"] == "Nested Loop"
        for inner in loop["Plans"][1:]
        for child in nodes(inner)
    ]


def scan_conditions(node: dict[str, Any]) -> str:
    return str(node.get("Index Cond", "")) + str(node.get("Recheck Cond", ""))


@pytest.mark.anyio
async def test_a_large_group_commit_is_planned_per_call_and_reads_each_table_by_the_array_once(
    empty_tables: App,
) -> None:
    """A group commit of more than PREPARED_GROUP_MAX results runs unprepared on the loops'
    connections, where psycopg prepares the hot statements after a few runs: each call is
    planned knowing its arrays' length, and finds the batch's task rows and attempts with one
    scan of each index for the whole array, never one probe per row that tests the array again
    (planned as the runtime plans it, with stale statistics: 1,500 of 2,000 tasks running). A
    small group is prepared as usual: its generic plan's cost is small, the parse and plan it
    saves are not."""
    app = empty_tables
    running, _ = stale_statistics(app, 2000, running=1500)
    ns, now = app.settings.namespace, app.clock()
    with runtime_engine(app).connect() as conn, conn.begin():
        conn.exec_driver_sql(
            "INSERT INTO dt_attempts (namespace, task_id, generation, attempt, delivery, worker_id, started_at)"
            " SELECT namespace, id, 0, 1, 0, 'w', now() FROM dt_tasks WHERE id = ANY(%(ids)s::text[])",
            {"ids": running},
        )
        conn.exec_driver_sql("ANALYZE dt_attempts")
        for size in (10, 500):
            params = statement_params("commit_results", ns, now, running[:size])
            (doc,) = conn.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + sql.postgres()["commit_results"], params
            ).scalar_one()
            plan = doc[0]["Plan"] if isinstance(doc, list) else doc["Plan"]
            assert not [p for p in row_by_row_probes(plan) if "ANY" in scan_conditions(p)], (size, plan)
        conn.rollback()

    small = [FinalWrite(first_attempt(ns, "no-such-task", now), "null")] * statements.PREPARED_GROUP_MAX
    large = [
        FinalWrite(first_attempt(ns, f"no-such-task-{i}", now), "null")
        for i in range(statements.PREPARED_GROUP_MAX + 1)
    ]
    prepared = OneStatement("SELECT statement FROM pg_prepared_statements", {}, lambda rows: [r[0] for r in rows])
    connections = AsyncConnections(app.engine, max_size=1, probe=ProbeSaying(Pooling.DIRECT))
    try:
        for _ in range(10):  # past psycopg's prepare_threshold (5)
            await connections.run(statements.commit_results(large, now))
        after_large = await connections.run(prepared)
        for _ in range(10):
            await connections.run(statements.commit_results(small, now))
        after_small = await connections.run(prepared)
    finally:
        connections.close()
    assert not [t for t in after_large if "fenced AS MATERIALIZED" in t], after_large
    assert [t for t in after_small if "fenced AS MATERIALIZED" in t], after_small  # a small group's is


def test_a_statement_planned_per_call_stays_unprepared_inside_a_transaction(make_app: Callable[..., App]) -> None:
    """Inside a larger transaction (a group commit with hooks) the statement runs on a pooled
    connection: it is not prepared there either, and the connection keeps its own threshold."""
    app = make_app()
    with app.engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        kept, driver.prepare_threshold = driver.prepare_threshold, 0  # 0: prepare on the first run
        try:
            for _ in range(3):
                OneStatement("SELECT 1 AS per_call", {}, list, prepare=False).run_on(conn)
                OneStatement("SELECT 2 AS prepared_as_usual", {}, list).run_on(conn)
            assert driver.prepare_threshold == 0
            texts = conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
        finally:
            driver.prepare_threshold = kept
            conn.rollback()
    assert [t for t in texts if "prepared_as_usual" in t], texts
    assert not [t for t in texts if "per_call" in t], texts


@pytest.mark.parametrize("settle", [None, ("child:0", ChildOutcome("SUCCEEDED", "1"))], ids=["resume", "settle"])
def test_a_resume_finds_its_task_by_primary_key_with_stale_statistics(
    make_app: Callable[..., App], settle: tuple[str, ChildOutcome] | None
) -> None:
    """The resume of a parent (one statement, in a child's final transaction on the App's own
    engine, where sequential scans are not priced out), alone or after it settles the child's
    slot, tests ``state = 'WAITING'`` on the row it found by key, never through the state index."""
    app = make_app()
    running, _ = stale_statistics(app, 4000, running=3000)
    statement = statements.resume_if_ready(app.settings.namespace, running[0], 0, app.clock(), settle=settle)
    plan = plan_of(app, "resume_if_ready", dict(statement.params))
    task_scans = [n for n in plan if n.get("Relation Name") == "dt_tasks" and n["Node Type"].endswith("Scan")]
    assert task_scans
    assert all(node.get("Index Name") == "dt_tasks_pkey" for node in task_scans), task_scans
    step_scans = [n for n in plan if n.get("Relation Name") == "dt_steps" and n["Node Type"].endswith("Scan")]
    assert len(step_scans) == (2 if settle else 1)  # the slot settled, by key; the open waits, by task
    assert all(node.get("Index Name") == "uq_dt_steps_slot" for node in step_scans), step_scans


def test_an_executions_fence_finds_its_task_by_primary_key_with_stale_statistics(make_app: Callable[..., App]) -> None:
    """The fence of an execution's single-row writes in SQLAlchemy Core (a recorded step, a
    suspension, a failure, a result with an on-commit hook), on the App's own engine: with
    statistics taken while no task ran, ``state = 'RUNNING'`` made ``ix_dt_tasks_sent`` (every
    sent task of the namespace) look like the way in. Namespace and state are filters only."""
    app = make_app()
    running, _ = stale_statistics(app, 4000, running=3000)
    claim = running_claim(app, running[0])
    statement = sa.update(tasks_table).where(claim.fence()).values(lease_expires_at=None)
    compiled = str(statement.compile(app.engine, compile_kwargs={"literal_binds": True}))
    with app.engine.connect() as conn:
        (doc,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + compiled).scalar_one()
    scans = [n for n in nodes(doc["Plan"]) if n.get("Relation Name") == "dt_tasks" and n["Node Type"].endswith("Scan")]
    assert scans
    assert all(node.get("Index Name") == "dt_tasks_pkey" for node in scans), scans


@pytest.mark.parametrize("name", ["record_step", "wait_fenced"])
def test_an_executions_one_statement_writes_find_their_rows_by_key_with_stale_statistics(
    make_app: Callable[..., App], name: str
) -> None:
    """PostgreSQL's recorded step (the fence's UPDATE and the step's INSERT) and a suspension's
    start (the fence's UPDATE to WAITING and the attempt's close), each one statement on the
    App's own engine: the task by primary key, namespace and state tested on it; the slot by
    its unique key, the attempt by ``ix_dt_attempts_task``."""
    app = make_app()
    running, _ = stale_statistics(app, 4000, running=3000)
    claim, now = running_claim(app, running[0]), app.clock()
    if name == "record_step":
        params = statements.record_step(claim, "model:0", "model", "1", now=now, lease=timedelta(seconds=30)).params
    else:
        params = statements.wait_fenced(claim, now).params
    plan = plan_of(app, name, dict(params))
    indexes = {"dt_tasks": "dt_tasks_pkey", "dt_steps": "uq_dt_steps_slot", "dt_attempts": "ix_dt_attempts_task"}
    scans = [n for n in plan if n.get("Relation Name") in indexes and n["Node Type"].endswith("Scan")]
    touched = {"record_step": {"dt_tasks", "dt_steps"}, "wait_fenced": {"dt_tasks", "dt_attempts"}}
    assert {n["Relation Name"] for n in scans} == touched[name], scans
    assert all(n.get("Index Name") == indexes[n["Relation Name"]] for n in scans), scans


def test_a_suspensions_children_find_a_taken_key_by_its_unique_index_with_stale_statistics(
    make_app: Callable[..., App],
) -> None:
    """PostgreSQL's one statement for a suspension's children looks a key that was taken (an
    earlier try's child) up by the key's unique index, never by a scan of the namespace's tasks."""
    app = make_app()
    running, _ = stale_statistics(app, 4000, running=3000)
    claim, now = running_claim(app, running[0]), app.clock()
    tasks = [child_task(claim, pending_child(f"child:{i}", i), queue="jobs", max_attempts=3) for i in range(2)]
    plan = plan_of(app, "submit_children", dict(submits.submit_children(tasks, ["c0", "c1"], now).params))
    scans = [n for n in plan if n.get("Relation Name") == "dt_tasks" and n["Node Type"].endswith("Scan")]
    assert scans
    assert all(n.get("Index Name") == "uq_dt_tasks_idem" for n in scans), scans


def test_a_suspension_on_children_finds_its_rows_by_key_with_stale_statistics(make_app: Callable[..., App]) -> None:
    """PostgreSQL's suspension on children alone: the task by primary key (namespace and state
    tested on it), its attempt by ``ix_dt_attempts_task``, a taken child key by its unique
    index; nothing scanned by another way."""
    app = make_app()
    running, _ = stale_statistics(app, 4000, running=3000)
    claim, now = running_claim(app, running[0]), app.clock()
    children = [(p, child_task(claim, p, queue="jobs", max_attempts=3)) for p in map(pending_child, "ab", [1, 2])]
    plan = plan_of(
        app, "suspend_on_children", dict(submits.suspend_on_children(claim, children, ["c0", "c1"], now).params)
    )
    indexes = {"dt_attempts": {"ix_dt_attempts_task"}, "dt_tasks": {"dt_tasks_pkey", "uq_dt_tasks_idem"}}
    scans = [n for n in plan if n.get("Relation Name") in indexes and n["Node Type"].endswith("Scan")]
    assert {n["Relation Name"] for n in scans} == set(indexes), scans
    assert all(n.get("Index Name") in indexes[n["Relation Name"]] for n in scans), scans
    assert {n.get("Index Name") for n in scans if n["Relation Name"] == "dt_tasks"} == indexes["dt_tasks"], scans


def running_claim(app: App, task_id: str) -> ExecutionClaim:
    """An execution of ``task_id``'s first attempt, as a worker's claim holds it."""
    return ExecutionClaim(
        namespace=app.settings.namespace,
        task_id=task_id,
        name="noop",
        queue="jobs",
        generation=0,
        attempt=1,
        delivery=0,
        max_attempts=3,
        failures=0,
        payload_json="0",
        idempotency_key=None,
        traceparent=None,
        shadow=False,
        created_at=app.clock(),
        enqueued_at=None,
        worker_id="w",
    )


def test_counts_by_state_read_the_partial_state_index_never_the_history(empty_tables: App) -> None:
    """On PostgreSQL ix_dt_tasks_state leaves out the tasks that succeeded
    (durable_tasks.state_indexes). The overview's counts per (queue, state), the workers' loads
    and the queues' backlogs read it, in the generic plan too (each repeats its predicate in
    constants), never the history; and the capped counts are right (SUCCEEDED's too, which that
    index does not hold and no view counts)."""
    app = empty_tables
    _, enqueued = stale_statistics(app, 1000, running=100)
    moved = {"PENDING": enqueued[:10], "RETRYING": enqueued[10:20], "FAILED": enqueued[20:30]}
    with app.engine.begin() as conn:
        for state, ids in moved.items():
            conn.exec_driver_sql(
                "UPDATE dt_tasks SET state = %(state)s, finished_at = %(at)s WHERE id = ANY(%(ids)s::text[])",
                {"state": state, "ids": ids, "at": app.clock() if state == "FAILED" else None},
            )
        # a history: 50,000 tasks that succeeded, copies of the last 500
        conn.exec_driver_sql(
            "INSERT INTO dt_tasks SELECT (jsonb_populate_record(t, jsonb_build_object('id', gen_random_uuid(),"
            " 'state', 'SUCCEEDED', 'finished_at', now()))).* FROM dt_tasks AS t, generate_series(1, 100)"
            " WHERE t.id = ANY(%(ids)s::text[])",
            {"ids": enqueued[-500:]},
        )
        conn.exec_driver_sql("ANALYZE dt_tasks")
    ns = app.settings.namespace
    states = ["PENDING", "ENQUEUED", "RUNNING", "RETRYING", "FAILED", "DEAD", "SUCCEEDED"]
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        statements.append((statement, params))

    sa.event.listen(app.engine, "before_cursor_execute", capture)
    try:
        counts = readmodel.state_counts(app.engine, ns, ["jobs"], states, cap=50)
        loads = readmodel.running_by_worker(app.engine, ns)
        with app.engine.connect() as conn:
            backlogs = queries.queue_backlogs(conn, ns)
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", capture)
    assert counts == {
        ("jobs", "PENDING"): 10,
        ("jobs", "ENQUEUED"): 51,  # 870, counted to the cap and one more
        ("jobs", "RUNNING"): 51,  # 100
        ("jobs", "RETRYING"): 10,
        ("jobs", "FAILED"): 10,
        ("jobs", "DEAD"): 0,
        ("jobs", "SUCCEEDED"): 51,
    }
    assert [(w.worker_id, w.running) for w in loads] == [("?", 100)]
    assert (backlogs["jobs"].running, backlogs["jobs"].outbox_backlog) == (100, 1000)
    any_index = "SUCCEEDED's: ix_dt_tasks_state leaves it out"
    by_state = ["ix_dt_tasks_state" if s != "SUCCEEDED" else any_index for s in states]
    expected = [by_state, ["ix_dt_tasks_state"], ["ix_dt_tasks_state"]]
    with app.engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # the plan on tables of any size
        for (statement, params), indexes in zip(statements, expected, strict=True):
            scans = task_scans(generic_plan(conn, statement, params))
            found = [n.get("Index Name") if i != any_index else i for n, i in zip(scans, indexes, strict=True)]
            assert found == indexes, (statement, scans)
        conn.rollback()


def task_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of ``plan`` that read ``dt_tasks`` (a bitmap scan: by its index's node)."""
    indexes = ("dt_tasks_pkey", "uq_dt_tasks_", "ix_dt_tasks_")
    return [
        n
        for n in nodes(plan)
        if (n.get("Relation Name") == "dt_tasks" and n["Node Type"] != "Bitmap Heap Scan")
        or (n["Node Type"] == "Bitmap Index Scan" and n["Index Name"].startswith(indexes))
    ]


@pytest.mark.anyio
async def test_a_retry_from_a_turn_finds_the_branchs_unfinished_tasks_without_reading_the_history(
    make_app: Callable[..., App],
) -> None:
    """Agent.retry_from cancels the superseded branch's unfinished tasks: it finds them among
    the namespace's unfinished tasks (ix_dt_tasks_state, which leaves out the history), in the
    generic plan too, not among every task the namespace ever ran."""
    app = make_app()
    agent = build(app, ScriptedModel(script), [])
    with Session(app.engine) as s:
        run_id = agent.start(s, "go")
        s.commit()
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=5))  # turn 0 recorded, its tool calls queued
    with app.engine.begin() as conn:  # a history: 20,000 tasks that succeeded
        conn.exec_driver_sql(
            "INSERT INTO dt_tasks SELECT (jsonb_populate_record(t, jsonb_build_object('id', gen_random_uuid(),"
            " 'idempotency_key', NULL, 'state', 'SUCCEEDED', 'finished_at', now()))).* FROM dt_tasks AS t,"
            " generate_series(1, 20000) WHERE t.id = (SELECT min(id) FROM dt_tasks WHERE namespace = %(ns)s)",
            {"ns": app.settings.namespace},
        )
        conn.exec_driver_sql("ANALYZE dt_tasks")
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        statements.append((statement, params))

    sa.event.listen(app.engine, "before_cursor_execute", capture)
    try:
        with Session(app.engine) as s:
            assert agent.retry_from(s, run_id, 0) == 1
            s.commit()
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", capture)
    t = tasks_table.c
    with app.engine.connect() as conn:
        cancelled = conn.execute(
            sa.select(t.name).where(t.idempotency_key.like(f"{run_id}:0:%"), t.state == "CANCELLED")
        ).scalars()
        assert sorted(name.rsplit(".", 1)[-1] for name in cancelled) == sorted(
            ["calculator", "lookup", "flaky", "calculator"]  # the unknown tool's call has no task
        )
        (statement, params) = next((st, p) for st, p in statements if "LIKE" in st)
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # the plan on tables of any size
        scans = task_scans(generic_plan(conn, statement, params))
        conn.rollback()
    assert [n.get("Index Name") for n in scans] == ["ix_dt_tasks_state"], scans
