"""The Agent: a model, its tools, and the turn and tool tasks that drive its durable runs."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any, get_type_hints

import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError
from sqlmodel import Session, col, select

from ..app import App
from ..errors import ConfigurationError, DurableTasksError, TaskNotFoundError
from ..records import TERMINAL_STATES, AgentRun, AgentTurn, TaskState, tasks_table
from ..state_indexes import state_index
from ..store.ids import is_task_id_shaped
from ..tasks import Task, TaskContext
from .model import ChatModel, Message, ModelTurn, RunInfo, ToolCall, ToolRequest, ToolSpec, TurnRequest

__all__ = ["Agent"]

_UNFINISHED = [state for state in TaskState if state not in TERMINAL_STATES]


class Agent:
    """Durable runs of one agent: a model, tools, and the tasks that drive them."""

    def __init__(
        self,
        app: App,
        name: str,
        model: ChatModel,
        *,
        queue: str = "agent",
        turn_max_attempts: int = 3,
        turn_timeout: timedelta | None = None,
        turn_retry_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.app = app
        self.name = name
        self.model = model
        self.queue = queue
        self.turn_max_attempts = turn_max_attempts
        self.turn_timeout = turn_timeout
        self.turn_retry_on = turn_retry_on
        self.tools: dict[str, tuple[ToolSpec, TypeAdapter[Any], Task[ToolRequest, Any]]] = {}
        self._turn = self._register_turn_task()

    # -- declaring tools -----------------------------------------------------------------

    def tool(
        self,
        *,
        name: str | None = None,
        description: str = "",
        max_attempts: int = 3,
        timeout: timedelta | None = None,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> Callable[[Callable[[TaskContext[Any], Any], Any]], Callable[[TaskContext[Any], Any], Any]]:
        """Declare ``fn(ctx, args)``; ``args`` is validated against its annotated pydantic model."""

        def register(fn: Callable[[TaskContext[Any], Any], Any]) -> Callable[[TaskContext[Any], Any], Any]:
            tool_name = name or fn.__name__
            if tool_name in self.tools:
                raise ConfigurationError(f"agent {self.name!r} already has a tool {tool_name!r}")
            adapter: TypeAdapter[Any] = TypeAdapter(_args_type(fn, tool_name))
            spec = ToolSpec(tool_name, description or (fn.__doc__ or "").strip(), adapter.json_schema())

            def validate(req: ToolRequest) -> tuple[Any, dict[str, Any] | None]:
                try:
                    return adapter.validate_python(req.arguments), None
                except ValidationError as exc:
                    # The model's mistake: tell the model, do not retry.
                    return None, {"error": f"invalid arguments for {tool_name}: {exc.errors(include_url=False)}"}

            run_tool: Callable[[TaskContext[ToolRequest], ToolRequest], Any]
            if inspect.iscoroutinefunction(fn):

                async def run_async(ctx: TaskContext[ToolRequest], req: ToolRequest) -> dict[str, Any]:
                    args, error = validate(req)
                    return error if error is not None else {"ok": await fn(ctx, args)}

                run_tool = run_async
            else:

                def run_sync(ctx: TaskContext[ToolRequest], req: ToolRequest) -> dict[str, Any]:
                    args, error = validate(req)
                    return error if error is not None else {"ok": fn(ctx, args)}

                run_tool = run_sync

            task = self.app.task(
                name=f"agent.{self.name}.tool.{tool_name}",
                queue=self.queue,
                max_attempts=max_attempts,
                timeout=timeout,
                retry_on=retry_on,
            )(run_tool)
            task.on_commit(lambda session, ctx, result: self._tool_settled(session, ctx.payload))
            task.on_failure(lambda session, ctx, error: self._tool_settled(session, ctx.payload))
            self.tools[tool_name] = (spec, adapter, task)
            return fn

        return register

    # -- runs ----------------------------------------------------------------------------

    def start(self, session: Session, messages: list[Message] | str) -> str:
        """Start a run in ``session``'s transaction (the caller commits); returns its id."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        run = AgentRun(
            id=str(uuid.uuid4()),
            namespace=self.app.settings.namespace,
            agent=self.name,
            input=json.dumps(messages),
            created_at=self.app.clock(),
        )
        session.add(run)
        session.flush()
        self._schedule_turn(session, run.id, 0, 0)
        return run.id

    def retry_from(self, session: Session, run_id: str, turn: int) -> int:
        """Restart a run from ``turn`` as a new generation; returns it. Turns before ``turn``
        are kept; the superseded branch's unfinished tasks are cancelled (fenced out)."""
        run = self._lock_run(session, run_id)
        old = run.generation
        run.generation, run.state, run.output, run.finished_at = old + 1, "RUNNING", None, None
        session.add(run)
        kept = session.exec(
            select(AgentTurn).where(AgentTurn.run_id == run_id, AgentTurn.generation == old, AgentTurn.index < turn)
        ).all()
        for t in kept:
            session.add(
                AgentTurn(
                    run_id=run_id,
                    generation=old + 1,
                    index=t.index,
                    output=t.output,
                    calls=t.calls,
                    tool_results=t.tool_results,
                    created_at=t.created_at,
                )
            )
        tc = tasks_table.c
        stale = (
            session.connection()
            .execute(
                sa.select(tc.id).where(
                    tc.namespace == self.app.settings.namespace,
                    tc.state.in_(_UNFINISHED),  # ix_dt_tasks_state: the unfinished tasks, not the history
                    state_index(),  # its predicate on PostgreSQL, in constants (a generic plan's too)
                    tc.idempotency_key.like(f"{run_id}:{old}:%"),
                )
            )
            .scalars()
        )
        for task_id in list(stale):
            self.app.cancel(session, task_id)
        session.flush()
        self._schedule_turn(session, run_id, old + 1, turn)
        return old + 1

    def get_run(self, run_id: str) -> RunInfo:
        """The run's state, answer, and its current generation's turns with tool results: each
        turn's ``calls`` in call order (``id``, ``task_id``, ``error``, ``result`` once settled);
        ``tool_results`` and ``tasks`` by the model's call id (the last call's for a repeated id)."""
        with Session(self.app.engine) as session:
            run = session.get(AgentRun, run_id) if is_task_id_shaped(run_id) else None
            if run is None or run.namespace != self.app.settings.namespace:
                raise TaskNotFoundError(f"no agent run {run_id!r}")
            turns = session.exec(
                select(AgentTurn)
                .where(AgentTurn.run_id == run_id, AgentTurn.generation == run.generation)
                .order_by(col(AgentTurn.index))
            ).all()
            return RunInfo(
                run.id,
                run.state,
                run.generation,
                run.output,
                [
                    {
                        "index": t.index,
                        "output": json.loads(t.output),
                        "tool_results": json.loads(t.tool_results) if t.tool_results else None,
                        "tasks": {c["id"]: c["task_id"] for c in calls},
                        "calls": calls,
                    }
                    for t in turns
                    for calls in [json.loads(t.calls)]
                ],
            )

    # -- the turn task -------------------------------------------------------------------

    def _register_turn_task(self) -> Task[TurnRequest, Any]:
        def turn(ctx: TaskContext[TurnRequest], req: TurnRequest) -> dict[str, Any]:
            with Session(self.app.engine) as session:
                run = session.get(AgentRun, req.run_id)
                if run is None or run.generation != req.generation:
                    return {"superseded": True}
                recorded = session.exec(
                    select(AgentTurn).where(
                        AgentTurn.run_id == req.run_id,
                        AgentTurn.generation == req.generation,
                        AgentTurn.index == req.index,
                    )
                ).first()
                if recorded is not None:  # never ask the model twice for a recorded turn
                    return {"output": json.loads(recorded.output), "recorded": True}
                messages = self._messages(session, run, req.index)
            specs = [spec for spec, _, _ in self.tools.values()]
            output = self.model.complete(messages, specs)
            return {"output": output.model_dump()}

        task = self.app.task(
            name=f"agent.{self.name}.turn",
            queue=self.queue,
            max_attempts=self.turn_max_attempts,
            timeout=self.turn_timeout,
            retry_on=self.turn_retry_on,
        )(turn)
        task.on_commit(self._turn_recorded)
        task.on_failure(self._turn_failed)
        return task

    def _turn_recorded(self, session: Session, ctx: TaskContext[TurnRequest], result: dict[str, Any]) -> None:
        req = ctx.payload
        run = self._lock_run(session, req.run_id)
        if run.generation != req.generation or result.get("superseded") or result.get("recorded"):
            return
        output = ModelTurn.model_validate(result["output"])
        calls = [self._submit_call(session, req, position, call) for position, call in enumerate(output.tool_calls)]
        turn = AgentTurn(
            run_id=req.run_id,
            generation=req.generation,
            index=req.index,
            output=output.model_dump_json(),
            calls=json.dumps(calls),
            created_at=self.app.clock(),
        )
        session.add(turn)
        if not output.tool_calls:
            run.state, run.output, run.finished_at = "DONE", output.content, self.app.clock()
            session.add(run)
            return
        session.flush()
        self._maybe_next_turn(session, run, turn)

    def _submit_call(self, session: Session, req: TurnRequest, position: int, call: ToolCall) -> dict[str, Any]:
        """One durable task per tool call, keyed by its position in the turn (model-chosen ids
        may repeat or be unusable as keys); a call that cannot become a task is an error result."""
        tool = self.tools.get(call.name)
        if tool is None:
            return {"id": call.id, "task_id": None, "error": f"unknown tool {call.name!r}"}
        try:
            handle = self.app.submit(
                session,
                tool[2],
                ToolRequest(
                    run_id=req.run_id,
                    generation=req.generation,
                    turn=req.index,
                    call_id=call.id,
                    arguments=call.arguments,
                ),
                idempotency_key=f"{req.run_id}:{req.generation}:{req.index}:{position}",
            )
        except DurableTasksError as exc:  # e.g. arguments too large: the model hears about it
            return {"id": call.id, "task_id": None, "error": f"{type(exc).__name__}: {exc}"}
        return {"id": call.id, "task_id": handle.id, "error": None}

    def _turn_failed(self, session: Session, ctx: TaskContext[TurnRequest], error: BaseException) -> None:
        """The model kept failing: the run ends FAILED with the reason."""
        if ctx.payload is None:
            return
        run = self._lock_run(session, ctx.payload.run_id)
        if run.generation == ctx.payload.generation:
            run.state, run.output, run.finished_at = "FAILED", f"{type(error).__name__}: {error}", self.app.clock()
            session.add(run)

    # -- settling tool calls -------------------------------------------------------------

    def _tool_settled(self, session: Session, req: ToolRequest | None) -> None:
        if req is None:
            return
        run = self._lock_run(session, req.run_id)
        if run.generation != req.generation:
            return  # a superseded branch: its result changes nothing
        turn = session.exec(
            select(AgentTurn).where(
                AgentTurn.run_id == req.run_id, AgentTurn.generation == req.generation, AgentTurn.index == req.turn
            )
        ).one()
        self._maybe_next_turn(session, run, turn)

    def _maybe_next_turn(self, session: Session, run: AgentRun, turn: AgentTurn) -> None:
        """If every tool call of ``turn`` is final, store their results on it and schedule the
        next turn, in the current transaction (the caller holds the run row's lock)."""
        if turn.tool_results is not None:
            return  # already settled (a duplicate hook run)
        calls: list[dict[str, Any]] = json.loads(turn.calls)
        task_ids = [c["task_id"] for c in calls if c["task_id"]]
        tc = tasks_table.c
        rows = {
            r.id: r
            for r in session.connection().execute(
                sa.select(tc.id, tc.state, tc.result, tc.error_type, tc.error_message).where(tc.id.in_(task_ids))
            )
        }
        for call in calls:  # each call's result on the call, by position: model ids may repeat
            if call["task_id"] is None:
                call["result"] = {"error": call["error"]}
                continue
            row = rows.get(call["task_id"])
            if row is None or row.state not in TERMINAL_STATES:
                return  # still running: the last one to settle schedules the next turn
            if row.state == TaskState.SUCCEEDED:
                call["result"] = json.loads(row.result)
            else:
                call["result"] = {"error": f"{row.error_type}: {row.error_message}"}
        turn.calls = json.dumps(calls)
        # also by the model's id, for readers that look a result up that way (the dashboard)
        turn.tool_results = json.dumps({call["id"]: call["result"] for call in calls})
        session.add(turn)
        session.flush()
        self._schedule_turn(session, run.id, run.generation, turn.index + 1)

    # -- helpers -------------------------------------------------------------------------

    def _schedule_turn(self, session: Session, run_id: str, generation: int, index: int) -> None:
        self.app.submit(
            session,
            self._turn.name,
            TurnRequest(run_id=run_id, generation=generation, index=index),
            idempotency_key=f"{run_id}:{generation}:turn:{index}",
        )

    def _lock_run(self, session: Session, run_id: str) -> AgentRun:
        # FOR UPDATE serializes the hooks of concurrent tool results on Postgres, so exactly
        # one of them sees all calls settled; SQLite transactions are serialized already.
        query = select(AgentRun).where(AgentRun.id == run_id).with_for_update()
        run = session.exec(query).first() if is_task_id_shaped(run_id) else None  # a run id is a UUID
        if run is None:
            raise TaskNotFoundError(f"no agent run {run_id!r}")
        return run

    def _messages(self, session: Session, run: AgentRun, upto: int) -> list[Message]:
        messages: list[Message] = list(json.loads(run.input))
        turns = session.exec(
            select(AgentTurn)
            .where(AgentTurn.run_id == run.id, AgentTurn.generation == run.generation, AgentTurn.index < upto)
            .order_by(col(AgentTurn.index))
        ).all()
        for t in turns:
            out = ModelTurn.model_validate_json(t.output)
            assistant: Message = {"role": "assistant", "content": out.content}
            if out.tool_calls:
                assistant["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in out.tool_calls
                ]
            messages.append(assistant)
            calls = json.loads(t.calls)
            by_id = json.loads(t.tool_results or "{}")  # a turn settled before calls kept their result
            for position, c in enumerate(out.tool_calls):
                result = calls[position].get("result", by_id.get(c.id))
                messages.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps(result)})
        return messages


def _args_type(fn: Callable[..., Any], tool: str) -> Any:
    """The annotation of a tool's second parameter (``dict[str, Any]`` when there is none)."""
    params = list(inspect.signature(fn).parameters)
    if len(params) != 2:
        raise ConfigurationError(f"tool {tool!r} must take (ctx, args), not {params}")
    try:
        return get_type_hints(fn).get(params[1], dict[str, Any])
    except NameError:  # an annotation imported only for type checkers
        return dict[str, Any]
