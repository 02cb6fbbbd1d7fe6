"""How long a task submitted into an idle App waits for its dispatcher, per wake-up.

    python -m benchmarks.wakeup_latency [--n 20]

One App (dispatcher + worker, default settings: poll_interval 2 s) per case; N submits, one
at a time and 0.3 s apart, each waited on until its handler ran; the figure is submit -> start
(the attempt's started_at minus the time just before the submit's transaction). Cases, in one
run: MariaDB with the Redis wake-up (durable_tasks.wakeup), MariaDB polling only, PostgreSQL
with LISTEN/NOTIFY. Databases come from DT_BENCH_MYSQL_URL / DT_BENCH_DATABASE_URL (default: the
machine's servers), each case in a database (schema) of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext

MYSQL = os.environ.get("DT_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
POSTGRES = os.environ.get("DT_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("DT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextmanager
def fresh_database(base: str) -> Iterator[str]:
    """A database (MySQL) or schema (PostgreSQL) of this run's own; its URL."""
    url = sa.make_url(base)
    name = f"dt_wake_{uuid.uuid4().hex[:8]}"
    postgres = url.get_backend_name() == "postgresql"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"' if postgres else f"CREATE DATABASE `{name}`")
    try:
        if postgres:
            yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(hide_password=False)
        else:
            yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE' if postgres else f"DROP DATABASE `{name}`")
        admin.dispose()


async def submit_to_start(database_url: str, n: int, *, wake_up: bool) -> list[float]:
    """Milliseconds from submit to handler start, for ``n`` tasks submitted one at a time."""
    app = App(database_url, REDIS, f"wake{uuid.uuid4().hex[:6]}", publish_on_commit=False)  # wake-ups alone

    @app.task(name="noop", queue="wake")
    async def noop(ctx: TaskContext[int], i: int) -> int:
        return i

    app.create_all()
    if not wake_up:
        app.runtime.wakeups.disable_wakeups()
    waits: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.run)
        await anyio.sleep(3)  # the loops start, the dispatcher's first passes find nothing
        for i in range(n):
            before = time.time()
            with Session(app.engine) as session:
                handle = app.submit(session, "noop", i)
                session.commit()
            await handle.wait(timeout=30)
            started = app.get_task(handle.id).started_at
            assert started is not None
            waits.append((started.timestamp() - before) * 1000)
            await anyio.sleep(0.3)  # idle again
        tg.cancel_scope.cancel()
    await app.aclose()
    return sorted(waits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20)
    a = ap.parse_args()
    cases = (
        ("MariaDB, Redis wake-up", MYSQL, True),
        ("MariaDB, polling", MYSQL, False),
        ("PostgreSQL, NOTIFY", POSTGRES, True),
    )
    for label, base, wake_up in cases:
        with fresh_database(base) as url:
            waits = anyio.run(lambda: submit_to_start(url, a.n, wake_up=wake_up))  # noqa: B023 - run at once
        p90 = waits[max(0, int(0.9 * len(waits)) - 1)]
        print(f"{label:24} submit->start ms  p50 {statistics.median(waits):7.1f}  p90 {p90:7.1f}  max {waits[-1]:7.1f}")


if __name__ == "__main__":
    main()
