"""The dashboard's approvals: open approvals listed from the step journal, answered with the
CSRF token (audited, refused in read-only mode, the first answer stays), and a journal-based
run's page with its steps; the answer resumes the run."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState, current_journal, readmodel
from durable_tasks.journal import StepKind
from durable_tasks.web import create_app
from tests.helpers import run_until

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)]

ASKS = {"tool": "refund", "amount": 30, "note": "<script>alert(1)</script>"}


def token_of(html: str) -> str:
    found = re.search(r'data-csrf="([0-9a-f]+)"', html)
    assert found is not None
    return found.group(1)


async def waiting_run(make_app: Callable[..., App]) -> tuple[App, str]:
    """A run suspended on the approval ``approval:call_1`` (WAITING: no slot, no lease)."""
    app = make_app()

    @app.task(name="agent.refunds", queue="agents")
    async def refunds(ctx: TaskContext[str], prompt: str) -> dict[str, Any]:
        journal = current_journal()
        assert journal is not None
        answer = await journal.wait_signal("approval:call_1", kind=StepKind.APPROVAL, request=ASKS)
        return {"answer": answer}

    with Session(app.engine) as session:
        task_id = refunds.submit(session, "refund order 7").id
        session.commit()
    await run_until(app, lambda: app.get_task(task_id).state == TaskState.WAITING, reaper=False)
    return app, task_id


async def test_an_open_approval_is_listed_answered_once_audited_and_resumes_the_run(
    make_app: Callable[..., App],
) -> None:
    app, task_id = await waiting_run(make_app)
    client = TestClient(create_app(app))

    listing = client.get("/approvals")
    assert listing.status_code == 200
    assert task_id[:8] in listing.text
    assert "approval:call_1" in listing.text
    assert "<script>alert(1)</script>" not in listing.text  # what is asked renders as text
    assert "refund" in listing.text

    run_page = client.get(f"/runs/{task_id}")
    assert run_page.status_code == 200
    assert "approval:call_1" in run_page.text
    assert 'value="approve"' in run_page.text
    assert client.get(f"/agents/{task_id}").status_code == 200  # the agent-run link finds it too

    form = {"task_id": task_id, "name": "approval:call_1", "decision": "approve", "reason": "within policy"}
    assert client.post("/approvals/answer", data=form).status_code == 403  # no CSRF token
    assert client.post("/approvals/answer", data=form | {"csrf_token": "f" * 64}).status_code == 403
    token = token_of(listing.text)
    bad = client.post("/approvals/answer", data=form | {"csrf_token": token, "decision": "maybe"})
    assert bad.status_code == 400
    assert "approve or deny" in bad.text
    done = client.post("/approvals/answer", data=form | {"csrf_token": token, "next": "run"}, follow_redirects=False)
    assert done.status_code == 303
    assert f"/runs/{task_id}" in done.headers["location"]
    assert "approved" in done.headers["location"]
    again = client.post(
        "/approvals/answer", data=form | {"csrf_token": token, "decision": "deny"}, follow_redirects=False
    )
    assert "answered+before" in again.headers["location"]

    audit = readmodel.audit_entries(app.engine, app.settings.namespace)
    assert sorted((e["action"], e["target"], e["outcome"]) for e in audit.items) == [
        ("approve", f"{task_id} approval:call_1", "approved"),
        ("deny", f"{task_id} approval:call_1", "answered before: the first answer stays"),
    ]
    assert app.open_approvals() == []
    assert "No approval is waiting" in client.get("/approvals").text

    await run_until(app, lambda: app.get_task(task_id).state == TaskState.SUCCEEDED, reaper=False)
    assert app.get_task(task_id).result == {
        "answer": {"approved": True, "reason": "within policy", "by": "anonymous@testclient"}
    }
    steps = client.get(f"/runs/{task_id}").text
    assert "within policy" in steps
    assert 'value="approve"' not in steps
    await app.aclose()


async def test_read_only_shows_approvals_without_buttons_and_refuses_answers(make_app: Callable[..., App]) -> None:
    app, task_id = await waiting_run(make_app)
    client = TestClient(create_app(app, read_only=True))
    listing = client.get("/approvals")
    assert "approval:call_1" in listing.text
    assert 'value="approve"' not in listing.text
    assert 'value="approve"' not in client.get(f"/runs/{task_id}").text
    form = {"task_id": task_id, "name": "approval:call_1", "decision": "approve", "csrf_token": token_of(listing.text)}
    assert client.post("/approvals/answer", data=form).status_code == 403
    assert [a.task_id for a in app.open_approvals()] == [task_id]
    await app.aclose()


async def test_a_run_cancelled_while_it_waits_for_an_approval_leaves_the_list(make_app: Callable[..., App]) -> None:
    app, task_id = await waiting_run(make_app)
    assert [a.task_id for a in app.open_approvals()] == [task_id]
    with Session(app.engine) as session:
        assert app.cancel(session, task_id)
        session.commit()
    assert app.open_approvals() == []  # its journal row stays open: the run waits for nothing
    assert "approval:call_1" not in TestClient(create_app(app)).get("/approvals").text
    await app.aclose()
