"""On SQLite (the embedded default, which plans without statistics), every statement a dispatch,
a drain, the reaper's read of a page of entries and a result wait run finds its task and
attempt rows by key, never by walking the namespace: a walk costs in proportion to the
finished history (durable_tasks.store.planning).

Each statement the runtime executes is planned again with ``EXPLAIN QUERY PLAN`` and the same
parameters; the plan may scan nothing of dt_tasks or dt_attempts, and may search them only by a
key: not by an index whose only bound column is the namespace."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from durable_tasks import App, TaskContext
from tests.helpers import submit_all

pytestmark = pytest.mark.anyio

#: a plan step that reads more of a table than the rows the statement names
_WALK = re.compile(r"^SCAN (dt_tasks|dt_attempts)\b|^SEARCH (dt_tasks|dt_attempts) USING .*\(namespace=\?\)$")


def plans(engine: sa.Engine, statements: list[tuple[str, Any]]) -> dict[str, list[str]]:
    """statement -> the details of its plan steps that walk a table (none: it goes by key)."""
    walks: dict[str, list[str]] = {}
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        for statement, params in statements:
            steps = [row[3] for row in raw.execute(f"EXPLAIN QUERY PLAN {statement}", params)]
            walks[statement] = [step for step in steps if _WALK.search(step)]
    return walks


async def test_a_dispatch_a_drain_and_the_reads_by_id_find_their_rows_by_key(sqlite_app: App) -> None:
    app = sqlite_app

    @app.task(name="job", queue="jobs")
    def job(ctx: TaskContext[int], n: int) -> int:
        return n

    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        reads_rows = re.match(r"\s*(UPDATE|DELETE|SELECT)\b", statement)
        if reads_rows and re.search(r"\bdt_(tasks|attempts)\b", statement) and not many:
            seen.append((statement, params))

    ids = [handle.id for handle in submit_all(app, "job", range(40))]
    ns = app.settings.namespace
    event.listen(app.engine, "before_cursor_execute", capture)
    try:
        while await app.dispatch_once():
            pass
        assert await app.work(max_tasks=40, timeout=timedelta(seconds=30)) == 40
        assert len(await app.runtime.store.lease_views(ns, ids)) == 40  # the reaper's read of a PEL page
        assert len(app.runtime.store.read_outcomes(ns, ids)) == 40  # result waits
    finally:
        event.remove(app.engine, "before_cursor_execute", capture)
    claims = [s for s, _ in seen if s.lstrip().startswith("UPDATE dt_tasks SET state=?, attempt=")]
    assert claims, "the drain's claim was not seen"
    walks = {statement: steps for statement, steps in plans(app.engine, seen).items() if steps}
    assert walks == {}
