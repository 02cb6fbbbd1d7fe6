"""The dashboard's pages at 1,000,000 tasks: how long each answers, and the plans of its queries.

    python -m benchmarks.bench_web [--rows 1000000] [--runs 10] [--plans plans.txt]

Fills a fresh Postgres schema with ``--rows`` tasks made by ``generate_series`` (30 days of
history in 3 queues and 10 task names: 96.3 % SUCCEEDED, 2 % FAILED, 1 % DEAD, 0.5 %
CANCELLED, the rest PENDING, ENQUEUED, RUNNING or RETRYING; one attempt per started task;
half the tasks with an idempotency key; 10,000 audit rows and 10,000 agent runs), runs VACUUM ANALYZE, then asks
every page ``--runs`` times over HTTP from a dashboard served by uvicorn in this process, and
prints one JSON line per page: the median and max of the server's time (request in to last
byte out: routing, queries, Redis, templates) and the median seen by the client, in ms.
With ``--plans``, every statement the pages sent is run again under EXPLAIN (ANALYZE,
BUFFERS), planned as the dashboard plans it, and the plans are written to that file.

Postgres and Redis come from DT_BENCH_DATABASE_URL / DT_BENCH_REDIS_URL (default: the local
servers); the schema and the namespace's Redis keys are dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import redis
import sqlalchemy as sa
import uvicorn

from durable_tasks import App
from durable_tasks import agents as _agents  # noqa: F401 - registers dt_agent_* for create_all
from durable_tasks.web import create_app

DB = os.environ.get("DT_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("DT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The execution option of the runtime's plans (durable_tasks.store.postgres.planner.runtime_plans).
KEYED = "dt_runtime_plans"
QUEUES = ("judge", "mail", "agent")

FILL_SQL = """
INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, state, generation, attempt,
    delivery, reclaims, counted_losses, failures, max_attempts, worker_id, result, error_type, error_message,
    traceparent, shadow, created_at, enqueued_at, started_at, finished_at)
SELECT md5(g::text)::uuid::text, :ns, 'app.task_' || (g % 10), (ARRAY['judge','mail','agent'])[1 + g % 3],
    CASE WHEN g % 2 = 0 THEN 'key-' || g END, '{"n": ' || g || '}', s.state, 0,
    CASE WHEN s.state IN ('PENDING','ENQUEUED') THEN 0 ELSE 1 END, 0, 0, 0,
    CASE WHEN s.state IN ('FAILED','DEAD') THEN 1 ELSE 0 END, 3,
    CASE WHEN s.state IN ('PENDING','ENQUEUED') THEN NULL ELSE 'worker-' || (g % 4) END,
    CASE WHEN s.state = 'SUCCEEDED' THEN '{"ok": true}' END,
    CASE WHEN s.state IN ('FAILED','DEAD') THEN 'ValueError' END,
    CASE WHEN s.state IN ('FAILED','DEAD') THEN 'bad input ' || g END,
    '00-' || md5(g::text) || '-' || substr(md5(g::text), 1, 16) || '-01', false,
    t.created, t.created + interval '20 ms', t.created + interval '30 ms',
    CASE WHEN s.state IN ('SUCCEEDED','FAILED','DEAD','CANCELLED')
         THEN t.created + (40 + g % 500) * interval '1 ms' END
FROM generate_series(1, :rows) AS g,
LATERAL (SELECT now() - (:rows - g) * (interval '30 days' / :rows) AS created) AS t,
LATERAL (SELECT CASE
    WHEN g % 1000 < 963 THEN 'SUCCEEDED' WHEN g % 1000 < 983 THEN 'FAILED' WHEN g % 1000 < 993 THEN 'DEAD'
    WHEN g % 1000 < 998 THEN 'CANCELLED'
    ELSE (ARRAY['PENDING','ENQUEUED','RUNNING','RETRYING'])[1 + (g / 1000) % 4] END AS state) AS s
"""

ATTEMPTS_SQL = """
INSERT INTO dt_attempts (namespace, task_id, generation, attempt, delivery, worker_id, started_at, finished_at,
    outcome, error_type, error_message, retry_reason)
SELECT namespace, id, 0, 1, 0, worker_id, started_at, finished_at,
    CASE state WHEN 'SUCCEEDED' THEN 'succeeded' WHEN 'RUNNING' THEN NULL ELSE 'failed' END,
    error_type, error_message, NULL
FROM dt_tasks WHERE namespace = :ns AND attempt > 0
"""

AGENT_RUNS_SQL = """
INSERT INTO dt_agent_runs (id, namespace, agent, generation, state, input, output, created_at, finished_at)
SELECT md5('run' || g)::uuid::text, :ns, 'helper', 0, 'DONE', '[{"role": "user", "content": "hi"}]', 'done',
    now() - g * interval '1 minute', now() - g * interval '1 minute' + interval '2 seconds'
FROM generate_series(1, 10000) AS g
"""

AUDIT_SQL = """
INSERT INTO dt_audit (namespace, at, actor, action, target, outcome)
SELECT :ns, now() - g * interval '1 minute', 'ops@127.0.0.1', 'rerun', md5(g::text), 'new generation queued'
FROM generate_series(1, 10000) AS g
"""


@contextmanager
def bench_app(rows: int) -> Iterator[App]:
    schema = f"dt_bench_web_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(DB)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.make_url(DB).update_query_dict({"options": f"-csearch_path={schema}"})
    namespace = f"bw{uuid.uuid4().hex[:8]}"
    app = App(url.render_as_string(hide_password=False), REDIS, namespace)
    for queue in QUEUES:  # the registry names the queues the overview shows
        app.task(name=f"app.{queue}", queue=queue)(lambda ctx, p: None)
    try:
        app.create_all()
        started = time.monotonic()
        with app.engine.begin() as conn:
            conn.execute(sa.text(FILL_SQL), {"ns": namespace, "rows": rows})
            conn.execute(sa.text(ATTEMPTS_SQL), {"ns": namespace})
            conn.execute(sa.text(AUDIT_SQL), {"ns": namespace})
            conn.execute(sa.text(AGENT_RUNS_SQL), {"ns": namespace})
        with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE dt_tasks, dt_attempts, dt_audit, dt_outbox, dt_agent_runs"))
        print(json.dumps({"filled": rows, "seconds": round(time.monotonic() - started, 1)}), flush=True)
        yield app
    finally:
        app.engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
        client = redis.Redis.from_url(REDIS)
        for key in client.scan_iter(match=f"dt:{{{namespace}:*", count=1000):
            client.delete(key)
        client.close()


def pages(app: App, rows: int) -> dict[str, str]:
    """Every page, by a name, with realistic filters (ids and keys of rows that exist)."""
    middle = rows // 4 * 2  # an even row: it has an idempotency key
    with app.engine.connect() as conn:
        some_id = conn.execute(sa.text(f"SELECT md5('{middle}')::uuid::text")).scalar_one()
        run_id = conn.execute(sa.text("SELECT md5('run5000')::uuid::text")).scalar_one()
    return {
        "overview": "/",
        "tasks": "/tasks",
        "tasks by id": f"/tasks?id={some_id}",
        "tasks by idempotency key": f"/tasks?key=key-{middle}",
        "tasks by name": "/tasks?name=app.task_3",
        "tasks FAILED in a queue": "/tasks?state=FAILED&queue=mail",
        "tasks RUNNING": "/tasks?state=RUNNING",
        "tasks in a time window": "/tasks?since=2000-01-01T00:00&until=2100-01-01T00:00&queue=judge",
        "task page": f"/tasks/{some_id}",
        "failures": "/failures",
        "failures DEAD in a queue": "/failures?state=DEAD&queue=agent",
        "dead letters": "/dead-letters?queue=judge",
        "workers": "/workers",
        "doctor": "/doctor",
        "agent runs": "/agents",
        "agent run": f"/agents/{run_id}",
        "schedules": "/schedules",
        "audit": "/audit",
    }


class Timed:
    """ASGI middleware keeping how long the server took for each request (in to last byte)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.started = 0
        self.times_ms: dict[int, float] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        number, self.started = self.started, self.started + 1
        started = time.perf_counter()
        await self.inner(scope, receive, send)
        self.times_ms[number] = (time.perf_counter() - started) * 1000

    def time_of(self, number: int) -> float:
        """The server's time for request ``number`` (recorded just after the client got it)."""
        while number not in self.times_ms:
            time.sleep(0.001)
        return self.times_ms[number]


@contextmanager
def serving(app: App) -> Iterator[tuple[httpx.Client, Timed]]:
    timed = Timed(create_app(app))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(timed, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client, timed
    finally:
        server.should_exit = True
        thread.join(10)


def measure(client: httpx.Client, timed: Timed, path: str, runs: int) -> tuple[dict[str, float], str | None]:
    """Server and client times of ``runs`` GETs (after one warm-up); the first answer's next-page link."""
    first = client.get(path)
    assert first.status_code == 200, (path, first.status_code, first.text[:300])
    server, seen = [], []
    for _ in range(runs):
        number = timed.started
        started = time.perf_counter()
        response = client.get(path)
        seen.append((time.perf_counter() - started) * 1000)
        server.append(timed.time_of(number))
        assert response.status_code == 200
    marker = 'id="next-page" href="'
    at = first.text.find(marker)
    link = first.text[at + len(marker) :].split('"', 1)[0].replace("&amp;", "&") if at >= 0 else None
    times = {
        "server_median_ms": round(statistics.median(server), 1),
        "server_max_ms": round(max(server), 1),
        "client_median_ms": round(statistics.median(seen), 1),
    }
    return times, link


def explain(app: App, statements: list[tuple[str, Any, bool]], out: str) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of each distinct statement, planned as the dashboard planned it
    (sequential scans priced out where it ran on the runtime's plans)."""
    seen: set[str] = set()
    with open(out, "w") as f, app.engine.connect() as conn:
        for statement, params, keyed in statements:
            if statement in seen or not statement.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            seen.add(statement)
            if keyed:
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).scalars().all()
            conn.rollback()
            f.write(statement.strip() + "\n\n" + "\n".join(plan) + "\n\n" + "-" * 100 + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--plans", help="write the EXPLAIN ANALYZE of every statement to this file")
    args = ap.parse_args()
    with bench_app(args.rows) as app:
        statements: list[tuple[str, Any, bool]] = []

        def keep(conn: sa.Connection, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            statements.append((statement, params, bool(conn.get_execution_options().get(KEYED))))

        sa.event.listen(app.engine, "before_cursor_execute", keep)
        with serving(app) as (client, timed):
            for name, path in pages(app, args.rows).items():
                times, next_page = measure(client, timed, path, args.runs)
                report: dict[str, Any] = {"page": name, "path": path, **times}
                if next_page:
                    later, _ = measure(client, timed, next_page.split(str(client.base_url), 1)[-1], args.runs)
                    report["next_page_server_median_ms"] = later["server_median_ms"]
                print(json.dumps(report), flush=True)
        if args.plans:
            explain(app, statements, args.plans)


if __name__ == "__main__":
    main()
