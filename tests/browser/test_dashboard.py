"""The dashboard in a real browser: live overview, a failure's traceback, replaying a dead
letter, CSRF, read-only mode, and a payload that tries to run script.

The tests run in file order on one stack: the first ones need the runtime stopped (a submit
must stay in the outbox, a delivery must be left to die), the later ones start it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlmodel import Session

from durable_tasks import App, TaskState
from tests.browser.conftest import Stack, wait_until
from tests.helpers import die_running_alone

pytestmark = pytest.mark.slow

XSS = '<script>window.__xss = 1</script><img src="x" onerror="window.__xss = 2">'
#: Set to a directory to keep a screenshot of each page (docs/img is made this way).
SCREENSHOTS = os.environ.get("DT_WEB_SCREENSHOTS")


def shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def submit(app: App, task: str, payload: dict[str, Any]) -> str:
    with Session(app.engine) as session:
        task_id = app.submit(session, task, payload).id
        session.commit()
    return task_id


def state_of(app: App, task_id: str) -> str:
    return app.get_task(task_id).state


@pytest.fixture(scope="module")
def dead_letter(stack: Stack) -> str:
    """A task whose only delivery died with its worker, dead-lettered by the reaper (before the
    runtime starts, so no live worker takes the delivery first)."""
    app = stack.app()
    submit(app, "web.nap", {"seconds": 0})
    doomed: list[str] = []

    async def go() -> None:
        await app.dispatch_once()
        [entry] = await app.runtime.transport().read(["web"], "doomed", count=1, block=timedelta(seconds=1))
        doomed.append((await die_running_alone(app, entry, "doomed")).task_id)
        with anyio.fail_after(30):
            while (await app.reap_once()).dead_lettered == 0:  # the lease must run out first
                await anyio.sleep(0.1)
        await app.aclose()

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's event loop
        pool.submit(anyio.run, go).result()
    return doomed[0]


@pytest.fixture(scope="module")
def runtime(stack: Stack, dead_letter: str) -> None:
    """The runtime (stopped with the stack's other processes)."""
    stack.spawn("runtime", "run", "tests.apps.web_app:app")


def test_overview_updates_live_without_a_reload(stack: Stack, page: Any) -> None:
    page.goto(stack.url + "/")
    backlog = page.locator('tr[data-queue="web"] td[data-k="outbox_backlog"]')
    page.wait_for_selector('tr[data-queue="web"]')
    before = int(backlog.inner_text())
    loaded_at = page.evaluate("window.dtLoadedAt")
    wait_until(lambda: page.evaluate("document.querySelector('#live #overview') !== null"), timeout=10, what="SSE")
    submit(stack.app(), "web.echo", {"text": "live"})
    # The dashboard polls every 30 s: a change well within that was woken by the submit's NOTIFY.
    wait_until(lambda: int(backlog.inner_text()) > before, timeout=15, what="the backlog to grow on the page")
    assert page.evaluate("window.dtLoadedAt") == loaded_at, "the page was reloaded"


def test_replaying_a_dead_letter_from_the_page_runs_it(
    stack: Stack, page: Any, dead_letter: str, runtime: None
) -> None:
    page.goto(stack.url + "/dead-letters?queue=web")
    assert dead_letter[:8] in page.inner_text("#letters")
    shot(page, "dead-letters")
    page.locator('#letters input[name="ids"]').first.check()
    page.click("#replay-selected")
    page.wait_for_selector("#notice")
    assert "1 task(s) replayed" in page.inner_text("#notice")
    app = stack.app()
    wait_until(lambda: state_of(app, dead_letter) == TaskState.SUCCEEDED, timeout=30, what="the replayed task")
    assert app.get_task(dead_letter).generation == 1
    page.goto(stack.url + "/audit")
    assert "dlq-replay" in page.inner_text("#audit")
    shot(page, "audit")


def test_a_failed_tasks_page_shows_its_error_and_traceback(stack: Stack, page: Any, runtime: None) -> None:
    app = stack.app()
    task_id = submit(app, "web.explode", {"text": "the tenth pancake"})
    wait_until(lambda: state_of(app, task_id) == TaskState.FAILED, timeout=30, what="the task to fail")
    page.goto(f"{stack.url}/tasks/{task_id}")
    rows = page.locator("#attempts tbody tr")
    assert rows.count() == 2
    for i in range(2):  # each attempt shows its error, then its traceback ending in that error
        cell = rows.nth(i).locator("td.err")
        assert cell.inner_text().strip().startswith("ValueError: cannot digest the tenth pancake")
        traceback = cell.locator(".traceback pre").inner_text()
        assert traceback.startswith("Traceback")
        assert traceback.rstrip().endswith("ValueError: cannot digest the tenth pancake")
    shot(page, "task-failed")
    page.goto(stack.url + "/failures?queue=web")
    assert task_id[:8] in page.inner_text("main")
    shot(page, "failures")


def test_a_payload_with_script_renders_as_text(stack: Stack, page: Any, runtime: None) -> None:
    app = stack.app()
    task_id = submit(app, "web.echo", {"text": XSS})
    wait_until(lambda: state_of(app, task_id) == TaskState.SUCCEEDED, timeout=30, what="the echo task")
    page.goto(f"{stack.url}/tasks/{task_id}")
    assert "<script>window.__xss = 1</script>" in page.inner_text("#payload")
    assert "<script>window.__xss = 1</script>" in page.inner_text("#result")
    assert page.evaluate("window.__xss === undefined")
    assert page.locator("main img").count() == 0
    shot(page, "task")
    page.goto(stack.url + "/tasks?queue=web")
    assert page.evaluate("window.__xss === undefined")
    shot(page, "tasks")


def test_an_action_without_the_csrf_token_is_refused(stack: Stack, page: Any, runtime: None) -> None:
    app = stack.app()
    task_id = submit(app, "web.echo", {"text": "keep me"})
    wait_until(lambda: state_of(app, task_id) == TaskState.SUCCEEDED, timeout=30, what="the echo task")
    page.goto(f"{stack.url}/tasks/{task_id}")  # the browser now holds the CSRF cookie
    url = f"{stack.url}/tasks/{task_id}/rerun"
    assert page.request.post(url, form={}).status == 403
    assert page.request.post(url, form={"csrf_token": "0" * 64}).status == 403
    status = page.evaluate("url => fetch(url, {method: 'POST'}).then(r => r.status)", url)
    assert status == 403
    assert app.get_task(task_id).generation == 0, "a refused action changed the task"
    page.click("#rerun")  # the page's own form carries the token
    page.wait_for_selector("#notice")
    assert "new generation queued" in page.inner_text("#notice")
    assert app.get_task(task_id).generation == 1


def test_read_only_mode_shows_no_action_and_refuses_them(stack: Stack, page: Any, runtime: None) -> None:
    app = stack.app()
    task_id = submit(app, "web.explode", {"text": "read only"})
    wait_until(lambda: state_of(app, task_id) == TaskState.FAILED, timeout=30, what="the task to fail")
    for path in (f"/tasks/{task_id}", "/failures", "/dead-letters?queue=web", "/"):
        page.goto(stack.read_only_url + path)
        assert page.locator('form[method="post"]').count() == 0, path
        assert page.locator("button[formaction], button.danger, button#rerun").count() == 0, path
    page.goto(f"{stack.read_only_url}/tasks/{task_id}")
    token = page.get_attribute("body", "data-csrf")
    response = page.request.post(f"{stack.read_only_url}/tasks/{task_id}/rerun", form={"csrf_token": token or ""})
    assert response.status == 403
    assert app.get_task(task_id).generation == 0


def test_workers_doctor_and_agent_pages_render(stack: Stack, page: Any, runtime: None) -> None:
    app = stack.app()
    task_id = submit(app, "web.echo", {"text": "warm"})
    wait_until(lambda: state_of(app, task_id) == TaskState.SUCCEEDED, timeout=30, what="the echo task")
    page.goto(stack.url + "/workers")
    assert "web" in page.inner_text("#consumers")
    shot(page, "workers")
    page.goto(stack.url + "/doctor")
    assert "maxmemory-policy" in page.inner_text("#findings")
    shot(page, "doctor")


def test_an_agent_runs_timeline_and_retry_from_a_turn(stack: Stack, page: Any, runtime: None) -> None:
    from tests.apps.web_app import forecaster

    app = stack.app()
    with Session(app.engine) as session:
        run_id = forecaster.start(session, "Weather in Oslo and Lima?")
        session.commit()
    wait_until(lambda: forecaster.get_run(run_id).state == "DONE", timeout=60, what="the agent run")
    page.goto(f"{stack.url}/agents")
    assert run_id[:8] in page.inner_text("#runs")
    page.goto(f"{stack.url}/agents/{run_id}")
    timeline = page.inner_text(".timeline")
    assert "Let me look both up." in timeline
    assert "Oslo: sunny" in timeline
    assert timeline.count("SUCCEEDED") == 2  # each tool call's task state
    page.locator(".retry-turn").nth(1).click()  # retry from turn 1: the model is asked again
    page.wait_for_selector("#notice")
    assert "generation 1 from turn 1" in page.inner_text("#notice")
    wait_until(lambda: forecaster.get_run(run_id).generation == 1, timeout=10, what="the new generation")
    wait_until(lambda: forecaster.get_run(run_id).state == "DONE", timeout=60, what="the retried run")
    page.goto(f"{stack.url}/agents/{run_id}")
    assert "(superseded)" in page.inner_text(".timeline")
    shot(page, "agent-run")
    page.goto(stack.url + "/")  # every earlier test's tasks have finished: the charts have points
    shot(page, "overview")


def test_an_approval_is_answered_from_the_page_and_the_run_resumes(stack: Stack, page: Any, runtime: None) -> None:
    app = stack.app()
    task_id = submit(app, "web.refund", {"text": "order 7"})
    wait_until(lambda: state_of(app, task_id) == TaskState.WAITING, timeout=60, what="the run to wait")
    page.goto(f"{stack.url}/approvals")
    row = page.locator("#approvals tr", has_text=task_id[:8])
    assert "approval:refund" in row.inner_text()
    shot(page, "approvals")
    row.locator('input[name="reason"]').fill("within policy")
    row.locator("button.approve").click()
    page.wait_for_selector("#notice")
    assert "approved" in page.inner_text("#notice")
    wait_until(lambda: state_of(app, task_id) == TaskState.SUCCEEDED, timeout=60, what="the resumed run")
    assert app.get_task(task_id).result["answer"]["reason"] == "within policy"
    page.goto(f"{stack.url}/runs/{task_id}")
    assert "within policy" in page.inner_text("#steps")
