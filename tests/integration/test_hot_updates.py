"""On PostgreSQL an outbox row's lease and an attempt's close change no indexed column, and their
tables leave half of each page free (migration 19): the new row version stays on its row's page,
a heap-only (HOT) update that writes no index entry. A row's ``ctid`` names its page; with pages
filled to the brim, each of these updates moved its row to another page."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.store.results import FinalWrite
from tests.helpers import private_schema

pytestmark = [pytest.mark.parametrize("database_url", ["postgres"], indirect=True), pytest.mark.anyio]

#: Enough rows to fill many pages of either table.
N = 400


@pytest.fixture
def app(database_url: str, tmp_path: Path) -> Iterator[App]:
    with private_schema(database_url, "dt_hot") as url:
        app = App(url, "redis://127.0.0.1:1/0", "hot", data_dir=tmp_path)  # Redis: never used here
        try:
            app.create_all()

            @app.task(name="noop", queue="jobs")
            def noop(ctx: TaskContext[Any], n: int) -> int:
                return n

            yield app
        finally:
            app.engine.dispose()


def pages(app: App, table: str, key: str) -> dict[object, int]:
    """Each row's page (the block number of its ctid), by ``key``."""
    with app.engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT {key}, (ctid::text::point)[0]::bigint FROM {table}")).all()
    return {row[0]: row[1] for row in rows}


def stayed(before: dict[object, int], after: dict[object, int]) -> float:
    """The share of the rows that are still on the page they were on."""
    return sum(after[key] == page for key, page in before.items()) / len(before)


async def test_the_dispatchers_lease_and_an_attempts_close_keep_their_rows_on_their_pages(app: App) -> None:
    with Session(app.engine) as s:
        ids = [app.submit(s, "noop", i).id for i in range(N)]
        s.commit()
    store, ns = app.runtime.store, app.settings.namespace

    outbox = pages(app, "dt_outbox", "id")
    leased = await store.lease_outbox(ns, now=app.clock(), lease=timedelta(seconds=30), limit=N, watermark=None)
    assert len(leased) == N
    assert stayed(outbox, pages(app, "dt_outbox", "id")) > 0.5  # about four in five (none with full pages)

    requests = [ClaimRequest(task_id, 0, 0, None) for task_id in ids]
    claims = await store.claim_executions(ns, requests, worker_id="w", now=app.clock(), lease=timedelta(seconds=30))
    assert all(isinstance(claim, ExecutionClaim) for claim in claims)
    attempts = pages(app, "dt_attempts", "task_id")
    await store.commit_results(
        [FinalWrite(claim, "0") for claim in claims if isinstance(claim, ExecutionClaim)], now=app.clock()
    )
    assert stayed(attempts, pages(app, "dt_attempts", "task_id")) > 0.5
