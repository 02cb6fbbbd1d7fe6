"""The dashboard's actions (POST): rerun and cancel tasks, one or in bulk by filter; replay and
purge dead letters; pause and resume schedules; retry an agent run from a turn; answer an
approval (:mod:`.approvals`).

Each action checks the CSRF token, is refused in read-only mode, goes through the App's own
operations (a rerun is a new generation through the outbox, never a hand-made stream entry),
and is written to ``dt_audit`` with who asked, what, when and what came of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from urllib.parse import urlencode

import sqlalchemy as sa
from anyio import to_thread
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import RedirectResponse
from sqlmodel import Session
from starlette.datastructures import URL

from .. import dlq, readmodel
from ..errors import DurableTasksError
from ..records import audit_table
from .approvals import add_approval_actions
from .context import Dashboard
from .pages import FAILED_STATES

__all__ = ["BULK_LIMIT", "add_actions"]

#: Tasks one bulk rerun touches at most (the operator repeats it for more).
BULK_LIMIT = 500


def _back(d: Dashboard, url: URL, notice: str) -> RedirectResponse:
    """303 back to a dashboard page (its path: the mount's prefix kept), with a sealed notice."""
    query = f"{url.query}&" if url.query else ""
    sealed = urlencode({"notice": notice, "seal": d.csrf.seal(notice)})
    return RedirectResponse(f"{url.path}?{query}{sealed}", status_code=303)


def add_actions(router: APIRouter, d: Dashboard) -> None:
    """Register every POST route of dashboard ``d`` on ``router``."""

    async def guard(request: Request) -> None:
        if d.read_only:
            raise HTTPException(403, "this dashboard is read-only")
        await d.csrf.verify(request)

    async def act(request: Request, action: str, target: str, run: Callable[[], Awaitable[str]]) -> str:
        """Run an action and write its audit row whatever came of it; returns its notice."""
        try:
            outcome = await run()
        except DurableTasksError as exc:
            outcome = f"refused: {exc}"
        row = {
            "namespace": d.namespace,
            "at": datetime.now(UTC),
            "actor": d.who(request)[:200],
            "action": action,
            "target": target,
            "outcome": outcome,
        }
        await to_thread.run_sync(lambda: _write_audit(d, row))
        return f"{action} {target}: {outcome}"

    guarded = [Depends(guard)]
    _add_task_actions(router, d, act, guarded)
    _add_dead_letter_actions(router, d, act, guarded)
    _add_schedule_actions(router, d, act, guarded)
    _add_agent_actions(router, d, act, guarded)
    add_approval_actions(router, d, act, guarded, _back)


def _write_audit(d: Dashboard, row: dict[str, object]) -> None:
    with d.app.engine.begin() as conn:
        conn.execute(sa.insert(audit_table).values(**row))


Act = Callable[[Request, str, str, Callable[[], Awaitable[str]]], Awaitable[str]]


def _rerun(d: Dashboard, task_ids: list[str]) -> int:
    with Session(d.app.engine) as session:
        for task_id in task_ids:
            d.app.rerun(session, task_id)
        session.commit()
    return len(task_ids)


def _rerun_failed(d: Dashboard, listed: list[tuple[str, int | None]]) -> int:
    """Rerun the failures an operator listed, ``(task id, generation seen or None)``, each only
    if still FAILED or DEAD (at that generation): two operators' bulk reruns of one filter
    rerun each task once. Returns how many were rerun."""
    with Session(d.app.engine) as session:
        rerun = [
            dlq.rerun_as_listed(d.app, session, task_id, generation=generation, states=FAILED_STATES)
            for task_id, generation in listed
        ]
        session.commit()
    return sum(generation is not None for generation in rerun)


def _add_task_actions(router: APIRouter, d: Dashboard, act: Act, guarded: list[object]) -> None:
    @router.post("/tasks/{task_id}/rerun", name="dt_task_rerun", dependencies=guarded)  # type: ignore[arg-type]
    async def rerun(request: Request, task_id: str) -> RedirectResponse:
        async def go() -> str:
            await to_thread.run_sync(lambda: _rerun(d, [task_id]))
            return "new generation queued"

        notice = await act(request, "rerun", task_id, go)
        return _back(d, request.url_for("dt_task", task_id=task_id), notice)

    @router.post("/tasks/{task_id}/cancel", name="dt_task_cancel", dependencies=guarded)  # type: ignore[arg-type]
    async def cancel(request: Request, task_id: str) -> RedirectResponse:
        def cancel_now() -> bool:
            with Session(d.app.engine) as session:
                done = d.app.cancel(session, task_id)
                session.commit()
            return done

        async def go() -> str:
            return "cancelled" if await to_thread.run_sync(cancel_now) else "already final, unchanged"

        notice = await act(request, "cancel", task_id, go)
        return _back(d, request.url_for("dt_task", task_id=task_id), notice)

    @router.post("/failures/rerun", name="dt_failures_rerun", dependencies=guarded)  # type: ignore[arg-type]
    async def rerun_failures(
        request: Request,
        ids: list[str] = Form(default_factory=list),  # noqa: B008 - FastAPI's form declaration
        state: str = Form(""),
        queue: str = Form(""),
        name: str = Form(""),
        scope: str = Form("selected"),
    ) -> RedirectResponse:
        async def chosen() -> list[tuple[str, int | None]]:
            if scope != "filter":  # the failures page's: still failed, whatever their generation
                return [(task_id, None) for task_id in ids[:BULK_LIMIT]]
            states = [state] if state in FAILED_STATES else list(FAILED_STATES)
            page = await to_thread.run_sync(
                lambda: readmodel.list_finished(
                    d.engine, d.namespace, states, queue=queue or None, name=name or None, limit=BULK_LIMIT
                )
            )
            return [(row.id, row.generation) for row in page.items]

        async def go() -> str:
            listed = await chosen()
            rerun = await to_thread.run_sync(lambda: _rerun_failed(d, listed))
            skipped = f", {len(listed) - rerun} no longer failed (rerun since, or gone)" if rerun < len(listed) else ""
            return f"{rerun} task(s) rerun{skipped}"

        target = f"filter state={state or 'FAILED|DEAD'} queue={queue or '*'} name={name or '*'}"
        notice = await act(request, "bulk-rerun", target if scope == "filter" else ",".join(ids[:BULK_LIMIT]), go)
        return _back(d, request.url_for("dt_failures"), notice)


def _add_dead_letter_actions(router: APIRouter, d: Dashboard, act: Act, guarded: list[object]) -> None:
    def entries(all_entries: str, ids: list[str]) -> list[str] | None:
        if all_entries == "1":
            return None
        if not ids:
            raise HTTPException(400, "choose entries, or all")
        return ids

    @router.post("/dead-letters/{queue}/replay", name="dt_dlq_replay", dependencies=guarded)  # type: ignore[arg-type]
    async def replay(
        request: Request,
        queue: str,
        ids: list[str] = Form(default_factory=list),  # noqa: B008 - FastAPI's form declaration
        all: str = Form(""),
    ) -> RedirectResponse:
        chosen = entries(all, ids)

        async def go() -> str:
            done = await dlq.replay(d.app, queue, chosen)
            notes = [
                f"{len(entries)} {what}"
                for entries, what in [
                    (done.rerun_since, "rerun since (entry removed)"),
                    (done.kept, "left (no task to rerun, or not DEAD at its generation)"),
                    (done.not_found, "not in the DLQ"),
                ]
                if entries
            ]
            return "; ".join([f"{len(done.rerun)} task(s) replayed", *notes])

        notice = await act(request, "dlq-replay", f"{queue}:{'all' if chosen is None else ','.join(chosen)}", go)
        return _back(d, request.url_for("dt_dead_letters").include_query_params(queue=queue), notice)

    @router.post("/dead-letters/{queue}/purge", name="dt_dlq_purge", dependencies=guarded)  # type: ignore[arg-type]
    async def purge(
        request: Request,
        queue: str,
        ids: list[str] = Form(default_factory=list),  # noqa: B008 - FastAPI's form declaration
        all: str = Form(""),
    ) -> RedirectResponse:
        chosen = entries(all, ids)

        async def go() -> str:
            return f"{await dlq.purge(d.app, queue, chosen)} entr(y/ies) purged"

        notice = await act(request, "dlq-purge", f"{queue}:{'all' if chosen is None else ','.join(chosen)}", go)
        return _back(d, request.url_for("dt_dead_letters").include_query_params(queue=queue), notice)


def _add_schedule_actions(router: APIRouter, d: Dashboard, act: Act, guarded: list[object]) -> None:
    @router.post("/schedules/{name}/pause", name="dt_schedule_pause", dependencies=guarded)  # type: ignore[arg-type]
    async def pause(request: Request, name: str, paused: str = Form("1")) -> RedirectResponse:
        stop = paused == "1"

        async def go() -> str:
            await to_thread.run_sync(d.app.pause_schedule if stop else d.app.resume_schedule, name)
            return "paused" if stop else "resumed (the ticks that fell while paused are skipped)"

        notice = await act(request, "schedule-pause" if stop else "schedule-resume", name, go)
        return _back(d, request.url_for("dt_schedules"), notice)


def _add_agent_actions(router: APIRouter, d: Dashboard, act: Act, guarded: list[object]) -> None:
    @router.post("/agents/{run_id}/retry", name="dt_agent_retry", dependencies=guarded)  # type: ignore[arg-type]
    async def retry(request: Request, run_id: str, agent: str = Form(...), turn: int = Form(...)) -> RedirectResponse:
        found = d.agents.get(agent)
        if found is None:
            raise HTTPException(400, f"agent {agent!r} is not known to this dashboard: pass it in agents=")

        def retry_now() -> int:
            with Session(d.app.engine) as session:
                generation = found.retry_from(session, run_id, turn)
                session.commit()
            return generation

        async def go() -> str:
            return f"generation {await to_thread.run_sync(retry_now)} from turn {turn}"

        notice = await act(request, "agent-retry", f"{run_id} turn {turn}", go)
        return _back(d, request.url_for("dt_agent_run", run_id=run_id), notice)
