"""The dashboard's pages (GET): overview, tasks, failures, dead letters, workers, doctor,
agent runs, audit log. Every list is one keyed page of the read model."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, StreamingResponse

from .. import dlq, readmodel
from ..doctor import diagnose, gather_facts
from ..errors import InvalidQueryError
from ..records import TaskState
from .approvals import add_approval_pages, journal_run_page
from .context import Dashboard, bad_query, parse_time
from .render import STATIC_DIR, STATIC_FILES

__all__ = ["add_pages"]

FAILED_STATES = (TaskState.FAILED.value, TaskState.DEAD.value)
#: How long the doctor's findings are shown before the checks run again.
DOCTOR_TTL_S = 60.0


def add_pages(router: APIRouter, d: Dashboard) -> None:
    """Register every GET route of dashboard ``d`` on ``router``."""
    _add_overview(router, d)
    _add_tasks(router, d)
    _add_failures(router, d)
    _add_operations(router, d)
    _add_agents(router, d)
    add_approval_pages(router, d)


def _add_overview(router: APIRouter, d: Dashboard) -> None:
    @router.get("/static/{path:path}", name="dt_static", include_in_schema=False)
    async def static(path: str) -> FileResponse:
        if path not in STATIC_FILES:
            raise HTTPException(404)
        return FileResponse(STATIC_DIR / path, media_type=STATIC_FILES[path])

    @router.get("/", name="dt_overview", response_class=HTMLResponse)
    async def overview(request: Request) -> HTMLResponse:
        return d.render(request, "overview.html", {"snap": await d.overview.snapshot()})

    @router.get("/events", name="dt_events", include_in_schema=False)
    async def events(request: Request) -> StreamingResponse:
        def render(snapshot: Any) -> str:
            return d.fragment(request, "partials/overview.html", {"snap": snapshot})

        return StreamingResponse(
            d.live.stream(render),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )


def _add_tasks(router: APIRouter, d: Dashboard) -> None:
    @router.get("/tasks", name="dt_tasks", response_class=HTMLResponse)
    async def tasks(
        request: Request,
        id: str = "",
        key: str = "",
        name: str = "",
        state: str = "",
        queue: str = "",
        since: str = "",
        until: str = "",
        cursor: str = "",
    ) -> HTMLResponse:
        try:
            flt = readmodel.TaskFilter(
                id.strip() or None,
                key or None,
                name or None,
                state or None,
                queue or None,
                parse_time(since),
                parse_time(until),
            )
            page = await to_thread.run_sync(
                lambda: readmodel.list_tasks(d.engine, d.namespace, flt, cursor=cursor or None)
            )
            names = await d.task_names()
        except InvalidQueryError as exc:
            raise bad_query(exc) from exc
        form = {"id": id, "key": key, "name": name, "state": state, "queue": queue, "since": since, "until": until}
        values = {
            "page": page,
            "form": form,
            "names": names,
            "queues": d.app.runtime.queues(),
            "states": list(TaskState),
        }
        return d.render(request, "tasks.html", values)

    @router.get("/tasks/{task_id}", name="dt_task", response_class=HTMLResponse)
    async def task(request: Request, task_id: str) -> HTMLResponse:
        detail = await to_thread.run_sync(lambda: readmodel.task_detail(d.engine, d.namespace, task_id))
        if detail is None:
            return d.render(request, "missing.html", {"what": f"task {task_id}"}, status=404)
        values = {"t": detail.task, "attempts": detail.attempts, "trace_link": d.trace_link(detail.trace_id)}
        return d.render(request, "task.html", values)


def _add_failures(router: APIRouter, d: Dashboard) -> None:
    @router.get("/failures", name="dt_failures", response_class=HTMLResponse)
    async def failures(
        request: Request, state: str = "", queue: str = "", name: str = "", cursor: str = ""
    ) -> HTMLResponse:
        states = [state] if state in FAILED_STATES else list(FAILED_STATES)
        try:
            page = await to_thread.run_sync(
                lambda: readmodel.list_finished(
                    d.engine, d.namespace, states, queue=queue or None, name=name or None, cursor=cursor or None
                )
            )
        except InvalidQueryError as exc:
            raise bad_query(exc) from exc
        form = {"state": state, "queue": queue, "name": name}
        return d.render(request, "failures.html", {"page": page, "form": form, "queues": d.app.runtime.queues()})

    @router.get("/dead-letters", name="dt_dead_letters", response_class=HTMLResponse)
    async def dead_letters(request: Request, queue: str = "", after: str = "") -> HTMLResponse:
        queues = d.app.runtime.queues()
        chosen = queue if queue in queues else (queues[0] if queues else "")
        letters = await dlq.list_dead_letters(d.app, chosen, count=readmodel.PAGE_SIZE + 1, after=after or None)
        more = len(letters) > readmodel.PAGE_SIZE
        letters = letters[: readmodel.PAGE_SIZE]
        transport = d.app.runtime.transport()
        length = int(await transport.client.xlen(transport.keys(chosen).dlq)) if chosen else 0
        values = {
            "queue": chosen,
            "queues": queues,
            "letters": letters,
            "next_after": letters[-1].entry_id if more and letters else None,
            "length": length,
        }
        return d.render(request, "dead_letters.html", values)


def _add_operations(router: APIRouter, d: Dashboard) -> None:
    @router.get("/workers", name="dt_workers", response_class=HTMLResponse)
    async def workers(request: Request) -> HTMLResponse:
        transport = d.app.runtime.transport()
        consumers = {q: await readmodel.stream_consumers(transport, q) for q in d.app.runtime.queues()}
        loads = await to_thread.run_sync(lambda: readmodel.running_by_worker(d.engine, d.namespace))
        values = {"consumers": consumers, "loads": loads, "lease_timeout": d.app.settings.lease_timeout}
        return d.render(request, "workers.html", values)

    checked: dict[str, Any] = {}

    @router.get("/doctor", name="dt_doctor", response_class=HTMLResponse)
    async def doctor(request: Request, again: bool = False) -> HTMLResponse:
        # The checks read server settings and reflect the schema (hundreds of ms): their
        # findings are kept for a while, and "check again" asks anew.
        at = checked.get("at")
        if again or at is None or (datetime.now(UTC) - at).total_seconds() > DOCTOR_TTL_S:
            checked.update(findings=diagnose(await gather_facts(d.app)), at=datetime.now(UTC))
        return d.render(request, "doctor.html", {"findings": checked["findings"], "checked_at": checked["at"]})

    @router.get("/schedules", name="dt_schedules", response_class=HTMLResponse)
    async def schedules(request: Request) -> HTMLResponse:
        found = await to_thread.run_sync(d.app.list_schedules)
        return d.render(request, "schedules.html", {"schedules": found})

    @router.get("/audit", name="dt_audit", response_class=HTMLResponse)
    async def audit(request: Request, before: int = 0) -> HTMLResponse:
        page = await to_thread.run_sync(lambda: readmodel.audit_entries(d.engine, d.namespace, before=before or None))
        return d.render(request, "audit.html", {"page": page})


def _add_agents(router: APIRouter, d: Dashboard) -> None:
    @router.get("/agents", name="dt_agents", response_class=HTMLResponse)
    async def agents(request: Request, cursor: str = "") -> HTMLResponse:
        try:
            page = await to_thread.run_sync(lambda: readmodel.agent_runs(d.engine, d.namespace, cursor=cursor or None))
        except InvalidQueryError as exc:
            raise bad_query(exc) from exc
        return d.render(request, "agents.html", {"page": page})

    @router.get("/agents/{run_id}", name="dt_agent_run", response_class=HTMLResponse)
    async def agent_run(request: Request, run_id: str) -> HTMLResponse:
        detail = await to_thread.run_sync(lambda: readmodel.agent_run(d.engine, d.namespace, run_id))
        if detail is None:  # a run of the pydantic-ai or Agents SDK integration: a task's journal
            found = await journal_run_page(request, d, run_id)
            return found or d.render(request, "missing.html", {"what": f"agent run {run_id}"}, status=404)
        turns = [_turn_view(t) for t in detail.turns]
        values = {
            "run": detail.run,
            "turns": turns,
            "tasks": detail.task_states,
            "can_retry": detail.run.get("agent") in d.agents,
        }
        return d.render(request, "agent_run.html", values)


def _turn_view(turn: dict[str, Any]) -> dict[str, Any]:
    """A recorded turn with its JSON columns read (text left as is when it is not JSON)."""
    view = dict(turn)
    for column in ("output", "calls", "tool_results"):
        raw = turn.get(column)
        try:
            view[column] = json.loads(raw) if raw else None
        except ValueError:
            view[column] = raw
    return view
