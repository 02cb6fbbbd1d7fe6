"""The dashboard's approvals: the open approvals suspended runs wait for (from the step journal,
``App.open_approvals``), answered with approve or deny; and a journal-based run's page (an
agent run of the pydantic-ai or Agents SDK integration: a task and its ``dt_steps``).

Answering is ``App.approve``, the same as ``durable-tasks approvals approve|deny``: idempotent
(the first answer stays), a POST with the CSRF token, refused in read-only mode, audited with
who answered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from anyio import to_thread
from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.datastructures import URL

from .. import readmodel
from .context import Dashboard

__all__ = ["add_approval_actions", "add_approval_pages", "journal_run_page"]

Act = Callable[[Request, str, str, Callable[[], Awaitable[str]]], Awaitable[str]]
Back = Callable[[Dashboard, URL, str], RedirectResponse]


def add_approval_pages(router: APIRouter, d: Dashboard) -> None:
    """``GET /approvals``: the open approvals, oldest first, a keyed page at a time."""

    @router.get("/approvals", name="dt_approvals", response_class=HTMLResponse)
    async def approvals(request: Request, after: int = 0) -> HTMLResponse:
        page = await to_thread.run_sync(lambda: readmodel.open_approvals(d.app, after=after))
        return d.render(request, "approvals.html", {"page": page})

    @router.get("/runs/{task_id}", name="dt_journal_run", response_class=HTMLResponse)
    async def journal_run(request: Request, task_id: str) -> HTMLResponse:
        found = await journal_run_page(request, d, task_id)
        if found is None:
            return d.render(request, "missing.html", {"what": f"journal-based run {task_id}"}, status=404)
        return found


async def journal_run_page(request: Request, d: Dashboard, task_id: str) -> HTMLResponse | None:
    """A journal-based run's page (its task, steps and open approvals), or None without one."""
    run = await to_thread.run_sync(lambda: readmodel.journal_run(d.app, task_id))
    if run is None:
        return None
    return d.render(request, "journal_run.html", {"run": run})


def add_approval_actions(router: APIRouter, d: Dashboard, act: Act, guarded: list[object], back: Back) -> None:
    """``POST /approvals/answer``: approve or deny one approval."""

    @router.post("/approvals/answer", name="dt_approval_answer", dependencies=guarded)  # type: ignore[arg-type]
    async def answer(
        request: Request,
        task_id: str = Form(...),
        name: str = Form(...),
        decision: str = Form(...),
        reason: str = Form(""),
        next_url: str = Form("", alias="next"),
    ) -> RedirectResponse:
        if decision not in ("approve", "deny"):
            raise HTTPException(400, f"decision {decision!r}: send approve or deny")
        approved = decision == "approve"
        who = d.who(request)[:200]

        async def go() -> str:
            fresh = await to_thread.run_sync(
                lambda: d.app.approve(task_id, name, approved=approved, reason=reason or None, by=who)
            )
            return ("approved" if approved else "denied") if fresh else "answered before: the first answer stays"

        notice = await act(request, "approve" if approved else "deny", f"{task_id} {name}", go)
        target = request.url_for("dt_journal_run", task_id=task_id) if next_url == "run" else None
        return back(d, target or request.url_for("dt_approvals"), notice)
