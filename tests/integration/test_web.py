"""The dashboard without a browser: the read model's keyed pages and capped counts, auth,
CSRF, read-only refusals, the audit log, mounting under a prefix, the bind check."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.testclient import TestClient
from sqlmodel import Session
from typer.testing import CliRunner

from durable_tasks import App, TaskContext, readmodel
from durable_tasks.cli import cli
from durable_tasks.errors import ConfigurationError, InvalidQueryError
from durable_tasks.records import tasks_table
from durable_tasks.store import schedules as schedules_store
from durable_tasks.store.schedules import DeclaredSchedule
from durable_tasks.web import BasicAuth, check_bind, create_app, create_router
from durable_tasks.web.overview import Overview


def with_tasks(make_app: Callable[..., App], count: int) -> tuple[App, list[str]]:
    app = make_app()

    @app.task(name="w.add", queue="wq")
    def add(ctx: TaskContext[dict[str, Any]], p: dict[str, Any]) -> None:
        return None

    with Session(app.engine) as session:
        ids = [app.submit(session, add, {"i": i}, idempotency_key=f"k{i}").id for i in range(count)]
        session.commit()
    return app, ids


def token_of(html: str) -> str:
    found = re.search(r'data-csrf="([0-9a-f]+)"', html)
    assert found is not None
    return found.group(1)


def test_task_pages_are_keyed_newest_first_and_cover_every_task_once(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 7)
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = readmodel.list_tasks(app.engine, app.settings.namespace, readmodel.TaskFilter(), cursor=cursor, limit=3)
        seen += [row.id for row in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted(ids)
    assert len(seen) == 7
    created = [readmodel.task_detail(app.engine, app.settings.namespace, i) for i in seen]
    times = [d.task["created_at"] for d in created if d is not None]
    assert times == sorted(times, reverse=True)


def test_a_task_is_found_by_its_idempotency_key_alone(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 3)
    found = readmodel.list_tasks(app.engine, app.settings.namespace, readmodel.TaskFilter(idempotency_key="k1"))
    assert [row.id for row in found.items] == [ids[1]]


def test_counts_stop_at_the_cap(make_app: Callable[..., App]) -> None:
    app, _ = with_tasks(make_app, 5)
    counts = readmodel.state_counts(app.engine, app.settings.namespace, ["wq"], ["PENDING", "FAILED"], cap=3)
    assert counts == {("wq", "PENDING"): 4, ("wq", "FAILED"): 0}


def test_a_bad_filter_or_cursor_is_a_typed_error(make_app: Callable[..., App]) -> None:
    with pytest.raises(InvalidQueryError, match="unknown state"):
        readmodel.TaskFilter(state="NOPE")
    app, _ = with_tasks(make_app, 1)
    with pytest.raises(InvalidQueryError, match="not a page cursor"):
        readmodel.list_tasks(app.engine, app.settings.namespace, readmodel.TaskFilter(), cursor="garbage")
    response = TestClient(create_app(app)).get("/tasks", params={"state": "NOPE"})
    assert response.status_code == 400
    assert "unknown state" in response.text


def test_actions_need_the_csrf_token_and_are_audited(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 1)
    client = TestClient(create_app(app))
    page = client.get(f"/tasks/{ids[0]}")
    assert page.status_code == 200
    assert client.post(f"/tasks/{ids[0]}/cancel").status_code == 403
    assert client.post(f"/tasks/{ids[0]}/cancel", data={"csrf_token": "f" * 64}).status_code == 403
    done = client.post(f"/tasks/{ids[0]}/cancel", data={"csrf_token": token_of(page.text)}, follow_redirects=False)
    assert done.status_code == 303
    assert "cancelled" in done.headers["location"]
    assert app.get_task(ids[0]).state == "CANCELLED"
    audit = readmodel.audit_entries(app.engine, app.settings.namespace)
    assert [(e["action"], e["target"], e["outcome"]) for e in audit.items] == [("cancel", ids[0], "cancelled")]
    assert audit.items[0]["actor"] == "anonymous@testclient"


def test_read_only_refuses_actions_even_with_a_token(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 1)
    client = TestClient(create_app(app, read_only=True))
    page = client.get(f"/tasks/{ids[0]}")
    assert 'action="' not in page.text.split("<h2>Payload")[0].split("</dl>")[1]
    refused = client.post(f"/tasks/{ids[0]}/cancel", data={"csrf_token": token_of(page.text)})
    assert refused.status_code == 403
    assert app.get_task(ids[0]).state == "PENDING"


def test_basic_auth_guards_every_page(make_app: Callable[..., App]) -> None:
    app, _ = with_tasks(make_app, 1)
    client = TestClient(create_app(app, basic_auth=BasicAuth("ops", "s3cret")))
    assert client.get("/tasks").status_code == 401
    assert client.get("/tasks", auth=("ops", "wrong")).status_code == 401
    assert client.get("/tasks", auth=("ops", "s3cret")).status_code == 200
    assert "s3cret" not in repr(BasicAuth("ops", "s3cret"))


def test_the_router_mounts_under_a_prefix_behind_the_host_apps_auth(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 1)

    def admin(request: Request) -> str:
        if request.headers.get("x-admin") != "yes":
            raise HTTPException(403, "admins only")
        return "admin"

    host = FastAPI()
    host.include_router(create_router(app, dependencies=[Depends(admin)]), prefix="/ops/tasks")
    client = TestClient(host)
    assert client.get(f"/ops/tasks/tasks/{ids[0]}").status_code == 403
    page = client.get(f"/ops/tasks/tasks/{ids[0]}", headers={"x-admin": "yes"})
    assert page.status_code == 200
    assert 'href="http://testserver/ops/tasks/static/app.css"' in page.text
    assert client.get("/ops/tasks/static/app.css", headers={"x-admin": "yes"}).status_code == 200
    assert client.get("/ops/tasks/static/../render.py", headers={"x-admin": "yes"}).status_code == 404


def test_the_dashboard_refuses_to_listen_beyond_loopback_without_auth(cli_app_env: Callable[..., Any]) -> None:
    check_bind("127.0.0.1", authenticated=False)
    check_bind("::1", authenticated=False)
    check_bind("0.0.0.0", authenticated=True)
    with pytest.raises(ConfigurationError, match="without authentication"):
        check_bind("0.0.0.0", authenticated=False)
    cli_app_env()
    result = CliRunner().invoke(cli, ["web", "tests.apps.cli_app:app", "--host", "0.0.0.0"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "refusing to serve the dashboard on 0.0.0.0" in result.output


@pytest.mark.anyio
async def test_the_overview_counts_failures_and_charts_what_finished(app: App) -> None:
    @app.task(name="w.ok", queue="wq")
    def ok(ctx: TaskContext[dict[str, Any]], p: dict[str, Any]) -> None:
        return None

    @app.task(name="w.boom", queue="wq", max_attempts=1)
    def boom(ctx: TaskContext[dict[str, Any]], p: dict[str, Any]) -> None:
        raise ValueError("boom")

    with Session(app.engine) as session:
        for task in (ok, ok, ok, boom):
            app.submit(session, task, {})
        session.commit()
    await app.dispatch_once()
    assert await app.work(max_tasks=4, timeout=timedelta(seconds=30)) == 4
    overview = Overview(app, settle=timedelta(0))  # the dashboard waits 2 s for late commits
    snapshot = await overview.snapshot()
    [queue] = snapshot.queues
    assert queue.counts["FAILED"] == 1
    assert queue.counts["PENDING"] == 0
    assert queue.failure_rate == 0.25
    assert queue.p50_ms is not None
    series = snapshot.series["wq"]
    assert (sum(series["done"]), sum(series["failed"])) == (3, 1)
    again = await overview.snapshot()  # nothing new finished: nothing is counted twice
    assert sum(again.series["wq"]["done"]) == 3


def test_a_task_page_links_to_its_trace(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 1)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with app.engine.begin() as conn:
        conn.execute(
            sa.update(tasks_table)
            .where(tasks_table.c.id == ids[0])
            .values(traceparent=f"00-{trace_id}-00f067aa0ba902b7-01")
        )
    client = TestClient(create_app(app, trace_url="http://jaeger.local:16686/trace/{trace_id}"))
    page = client.get(f"/tasks/{ids[0]}")
    assert f'href="http://jaeger.local:16686/trace/{trace_id}"' in page.text


def test_a_schedule_is_listed_and_paused_from_the_page(make_app: Callable[..., App]) -> None:
    app, _ = with_tasks(make_app, 1)
    now = datetime.now(UTC)
    declared = DeclaredSchedule("nightly", "w.add", "every 3600s", "latest", now + timedelta(hours=1))
    schedules_store.declare(app.engine, app.settings.namespace, [declared], now)
    client = TestClient(create_app(app))
    page = client.get("/schedules")
    assert "nightly" in page.text
    assert "every 3600s" in page.text
    done = client.post(
        "/schedules/nightly/pause", data={"csrf_token": token_of(page.text), "paused": "1"}, follow_redirects=False
    )
    assert done.status_code == 303
    assert schedules_store.load(app.engine, app.settings.namespace)["nightly"].paused
    audit = readmodel.audit_entries(app.engine, app.settings.namespace)
    assert (audit.items[0]["action"], audit.items[0]["target"]) == ("schedule-pause", "nightly")


def test_a_notice_shows_only_when_the_dashboard_wrote_it(make_app: Callable[..., App]) -> None:
    app, ids = with_tasks(make_app, 1)
    client = TestClient(create_app(app))
    forged = client.get("/tasks", params={"notice": "Session expired: log in at evil.example"})
    assert "evil.example" not in forged.text
    page = client.get(f"/tasks/{ids[0]}")
    done = client.post(f"/tasks/{ids[0]}/cancel", data={"csrf_token": token_of(page.text)})
    assert f"cancel {ids[0]}: cancelled" in done.text  # followed the redirect to the task page
