"""pydantic-ai agents on durable_tasks: ``Agent(..., capabilities=[DurableTasksDurability(app)])``.

Built on pydantic-ai's public third-party durability API (``pydantic_ai.durable_exec``:
``BaseDurabilityCapability``, ``DurableOperationBackend``, ``ParameterTransports``,
``DurableRunContext``, ``ExternalEventWaiter``), tested with pydantic-ai-slim 2.68.0. Run the agent
inside a task and the run is durable; outside a task the capability steps aside::

    agent = Agent(model, name="helper", capabilities=[DurableTasksDurability(app)], tools=[...])

    @app.task(name="agent.helper", queue="agents")
    async def run_helper(ctx: TaskContext[Prompt], p: Prompt) -> str:
        return (await agent.run(p.text)).output

What each operation becomes:

- a **model request** (and MCP/dynamic discovery, capability operations, event handling) is a
  journaled step of the task: a replay returns the recorded response;
- a **function-tool call** is a child task ``pydantic_ai.<agent>.tool.<tool>`` (registered when
  the agent is built, so every worker that imports the agent can run it), idempotency key
  ``task:generation:slot``, with the tool's :class:`~durable_tasks.integrations.ToolPolicy`;
  the parent waits for its tools without a worker slot. The run context crosses as JSON
  (``DurableRunContext``), so ``deps`` must be JSON-serializable;
- **argument validation** runs in place (it is deterministic): invalid arguments go back to
  the model as a retry prompt, no task is created;
- **approvals** (``requires_approval=True`` tools) wait for a signal named ``approval:<call id>``
  (``#<n>`` added when a later turn reuses the id; ``durable-tasks approvals`` lists them);
  other external-event waits (``RequestInput``, ``AskUser``) wait for a signal named after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal, cast

from pydantic import JsonValue, TypeAdapter
from pydantic_ai import ToolDenied
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    BoundDurableOperation,
    DurabilityEngineSpec,
    DurableOperation,
    DurableOperationBackend,
    DurableRunContext,
    ExternalEventError,
    ExternalEventWaiter,
    JournalOperationNamer,
    ParameterTransport,
    ParameterTransports,
    ToolsetCallToolId,
    ToolsetCallToolParams,
    ToolsetValidateToolArgumentsId,
    durable_unit_scope,
    external_event_scope,
    revalidate_function_call,
)
from pydantic_ai.durable_exec._operation_backend import in_durable_unit
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, DeferredToolResults, RunContext, ToolDefinition
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.toolsets.function import FunctionToolsetTool
from pydantic_core import to_jsonable_python

from ..app import App
from ..errors import ChildTaskFailedError
from ..journal import Journal, StepKind, current_journal
from ..tasks import TaskContext
from ._policy import (
    DEFAULT_POLICY,
    ToolPolicy,
    approval_signal,
    failure_message,
    hands_to_model,
    policy_for,
    tool_label,
    tool_task_name,
)

__all__ = ["DurableTasksDurability", "ToolPolicy"]

ENGINE_SPEC = DurabilityEngineSpec(
    engine_name="durable_tasks",
    durable_unit_noun="step",
    durable_container_noun="task",
    codec=JSON_CODEC,  # the journal stores JSON
    wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
    toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit", "dynamic": "enter-never"},
    unsupported_runtime_toolset_kinds=frozenset({"function"}),  # their tools must be registered tasks
)


def _journal() -> Journal:
    journal = current_journal()
    if journal is None:  # pragma: no cover - bound operations run only inside a durable context
        raise RuntimeError("a durable_tasks operation ran outside a task")
    return journal


class DurableTasksDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable on durable_tasks when it runs inside a task (see the module doc)."""

    engine_spec = ENGINE_SPEC

    def __init__(
        self,
        app: App,
        *,
        queue: str = "agents",
        tool_policy: ToolPolicy = DEFAULT_POLICY,
        tool_policies: Mapping[str, ToolPolicy] | None = None,
        name: str | None = None,
        models: Mapping[str, Any] | None = None,
    ) -> None:
        """``queue`` runs the tool tasks; ``tool_policy`` applies to every tool that
        ``tool_policies`` (by tool name) does not name."""
        super().__init__(models=models, name=name)
        self.app = app
        self.queue = queue
        self.tool_policy = tool_policy
        self.tool_policies = dict(tool_policies or {})
        self._backend: _Backend | None = None

    # -- BaseDurabilityCapability --------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        """Inside a task's handler, and not inside one of its durable units (a tool task)."""
        return current_journal() is not None and not in_durable_unit()

    def get_default_run_id(self) -> str | None:
        """The same id on every replay of the task's generation."""
        journal = current_journal()
        return journal.deterministic_id("pydantic_ai.run") if journal is not None and self.in_durable_context else None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        """The backend that turns operations into journaled steps and tool tasks."""
        if self._backend is None:
            self._backend = _Backend(self)
        return self._backend

    def _bind_to_agent(self, agent: Any) -> None:
        self._backend = _Backend(self)
        super()._bind_to_agent(agent)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        """External-event waits inside the run become signal waits of the task."""
        if not self.in_durable_context:
            return await super().wrap_run(ctx, handler=handler)
        with external_event_scope(_SignalWaiter()):
            return await super().wrap_run(ctx, handler=handler)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Each call that needs approval waits for its own signal (``approval_signal``), with
        ``{"approved": bool, "reason": ..., "by": ...}`` as the decision."""
        if not self.in_durable_context or not requests.approvals:
            return None
        journal = _journal()
        approvals: dict[str, Any] = {}
        answered_by: dict[str, str] = {}
        for position, call in enumerate(requests.approvals):
            decision = await journal.wait_signal(
                approval_signal(journal, call.tool_call_id),
                kind=StepKind.APPROVAL,
                request={"tool": call.tool_name, "args": call.args_as_dict(), "tool_call_id": call.tool_call_id},
                order=position,
            )
            approvals[call.tool_call_id], by = _approval(decision)
            if by:
                answered_by[call.tool_call_id] = by
        return requests.build_results(approvals=approvals, answered_by=answered_by)

    # -- tool tasks ------------------------------------------------------------------------

    def register_tool_tasks(self, toolset: FunctionToolset[Any], run: Callable[..., Any]) -> dict[str, str]:
        """Register the tasks that run ``toolset``'s tools: one per tool known now or named in
        ``tool_policies`` (its own policy), and ``""`` for the others (the default policy).
        Every process that builds the agent registers the same ones."""
        toolset_id = (toolset.id or "agent").strip("<>")
        names = {"": tool_task_name("pydantic_ai", self.name, f"{toolset_id}.*")}
        for tool in sorted(set(toolset.tools) | set(self.tool_policies)):
            names[tool] = tool_task_name("pydantic_ai", self.name, tool)
        for tool, name in names.items():
            if name in self.app.registry:
                continue
            policy = policy_for(tool, self.tool_policy, self.tool_policies)
            self.app.task(
                name=name,
                queue=self.queue,
                max_attempts=policy.max_attempts,
                timeout=policy.timeout,
                retry_on=policy.retry_on,
            )(run)
        return names


def _approval(decision: Any) -> tuple[Any, str | None]:
    """A signal's decision as a pydantic-ai approval result (True, or ToolDenied with the reason)."""
    if not isinstance(decision, dict):
        decision = {"approved": bool(decision)}
    by = decision.get("by")
    if decision.get("approved") is True:
        return True, by if isinstance(by, str) else None
    reason = decision.get("reason") or "The tool call was denied."
    return ToolDenied(str(reason)), by if isinstance(by, str) else None


class _SignalWaiter(ExternalEventWaiter):
    """``wait_for_external_event`` inside a durable run: ``ask`` is a journaled step and the
    wait is the signal named ``event:<name>``; the token is ``task_id:generation:event:<name>``."""

    async def wait(
        self, name: str, *, ask: Callable[[str], Awaitable[JsonValue]], timeout: timedelta | None
    ) -> JsonValue:
        journal = _journal()
        signal = f"event:{name}#{journal.sequence(f'event:{name}')}"
        token = f"{journal.task_id}:{journal.generation}:{signal}"
        answer = await journal.step(f"event:{name}.ask", lambda: ask(token))
        if answer is not None:
            return cast("JsonValue", answer)
        payload = await journal.wait_signal(signal, request={"event": name, "token": token})
        if isinstance(payload, dict) and payload.get("error") and len(payload) == 1:
            raise ExternalEventError(str(payload["error"]))
        return cast("JsonValue", payload)


# -- the backend ---------------------------------------------------------------------------


class _Backend(DurableOperationBackend[ToolPolicy | None]):
    """Journaled steps for everything but function-tool calls, which become child tasks."""

    def __init__(self, capability: DurableTasksDurability[Any]) -> None:
        self.capability = capability
        self.parameter_transports = _Transports(capability)

    def bind(self, operation: DurableOperation[Any, Any, Any]) -> BoundDurableOperation[Any, Any, Any]:
        oid = operation.operation_id
        if isinstance(oid, ToolsetValidateToolArgumentsId):
            return _Direct(operation)  # deterministic: no record needed
        transport = operation.parameter_transport
        if isinstance(oid, ToolsetCallToolId) and isinstance(transport, _FunctionCallTransport):
            return _ToolTask(operation, transport, self.capability)
        namer = JournalOperationNamer(self.capability.name, default_model_id="default")
        return _Step(operation, namer.operation_name(oid))

    def config_for_tool(
        self, operation: DurableOperation[Any, Any, Any], *, tool: object | None, tool_name: str
    ) -> ToolPolicy | Literal[False] | None:
        return policy_for(tool_name, self.capability.tool_policy, self.capability.tool_policies)

    def registrations(self) -> Sequence[Callable[..., object]]:
        return ()


class _Direct(BoundDurableOperation[Any, Any, Any]):
    def __init__(self, operation: DurableOperation[Any, Any, Any]) -> None:
        self._operation = operation

    @property
    def operation(self) -> DurableOperation[Any, Any, Any]:
        return self._operation

    async def __call__(self, params: Any, *, config: object | None = None) -> Any:
        with durable_unit_scope():
            return await self._operation.handler(params)


class _Step(BoundDurableOperation[Any, Any, Any]):
    """One journaled step per call, labelled with the operation's stable name."""

    def __init__(self, operation: DurableOperation[Any, Any, Any], label: str) -> None:
        self._operation = operation
        self._label = label

    @property
    def operation(self) -> DurableOperation[Any, Any, Any]:
        return self._operation

    async def __call__(self, params: Any, *, config: object | None = None) -> Any:
        operation = self._operation
        label = self._label
        if operation.invocation_label is not None:
            label = f"{label}:{operation.invocation_label(params)}"

        async def body() -> object:
            with durable_unit_scope():
                return operation.result_codec.dump(await operation.handler(params))

        return operation.result_codec.load(await _journal().step(label, body))


class _ToolTask(BoundDurableOperation[Any, Any, Any]):
    """A function-tool call as a child task of the running task."""

    def __init__(
        self,
        operation: DurableOperation[Any, Any, Any],
        transport: _FunctionCallTransport,
        capability: DurableTasksDurability[Any],
    ) -> None:
        self._operation = operation
        self._transport = transport
        self._capability = capability
        self._tasks = capability.register_tool_tasks(transport.toolset, self._task_handler())

    @property
    def operation(self) -> DurableOperation[Any, Any, Any]:
        return self._operation

    def _task_handler(self) -> Callable[[TaskContext[dict[str, Any]], dict[str, Any]], Awaitable[Any]]:
        operation, transport, capability = self._operation, self._transport, self._capability

        async def run_tool(ctx: TaskContext[dict[str, Any]], wire: dict[str, Any]) -> Any:
            params = transport.load(wire, runtime=capability)
            with durable_unit_scope():
                return operation.result_codec.dump(await operation.handler(params))

        return run_tool

    async def __call__(self, params: ToolsetCallToolParams, *, config: object | None = None) -> Any:
        task = self._tasks.get(params.name) or self._tasks[""]
        call_id = params.ctx.tool_call_id
        label = tool_label(params.name, call_id, params.tool_args)
        try:
            payload = await _journal().child(
                task, self._transport.dump(params), label=label, order=_position(params.ctx, call_id)
            )
        except ChildTaskFailedError as exc:
            policy = config if isinstance(config, ToolPolicy) else self._capability.tool_policy
            if hands_to_model(policy, exc):
                raise ToolFailed(failure_message(params.name, exc)) from exc
            raise
        return self._operation.result_codec.load(payload)


def _position(ctx: RunContext[Any], call_id: str | None) -> int | None:
    """The call's position among the tool calls of the response that asked for it."""
    for message in reversed(ctx.messages):
        if isinstance(message, ModelResponse):
            ids = [part.tool_call_id for part in message.parts if isinstance(part, ToolCallPart)]
            return ids.index(call_id) if call_id in ids else None
    return None


# -- crossing into the tool task -----------------------------------------------------------

_TOOL_DEF = TypeAdapter(ToolDefinition)


class _FunctionCallTransport(ParameterTransport[ToolsetCallToolParams, dict[str, Any]]):
    """A function-tool call as a JSON payload: name, arguments, tool definition, run context, deps."""

    def __init__(self, capability: DurableTasksDurability[Any], toolset: FunctionToolset[Any]) -> None:
        self.capability = capability
        self.toolset = toolset

    def dump(self, params: ToolsetCallToolParams) -> dict[str, Any]:
        tool = params.tool
        return {
            "name": params.name,
            "tool_args": to_jsonable_python(params.tool_args),
            "run_context": to_jsonable_python(DurableRunContext.serialize_run_context(params.ctx)),
            "deps": to_jsonable_python(params.ctx.deps),
            "tool_def": _TOOL_DEF.dump_python(tool.tool_def, mode="json") if tool is not None else None,
            "original_name": tool.original_name if isinstance(tool, FunctionToolsetTool) else None,
        }

    def load(self, payload: dict[str, Any], *, runtime: object) -> ToolsetCallToolParams:
        agent = self.capability.agent
        deps = payload["deps"]
        if agent is not None and deps is not None and agent.deps_type is not type(None):
            deps = TypeAdapter(agent.deps_type).validate_python(deps)
        ctx = DurableRunContext.restore(payload["run_context"], deps=deps, agent=agent, engine_spec=ENGINE_SPEC)
        tool_def = payload.get("tool_def")
        tool = (
            self.toolset.tool_for_tool_def(
                _TOOL_DEF.validate_python(tool_def), ctx=ctx, original_name=payload.get("original_name")
            )
            if tool_def is not None
            else None
        )
        return ToolsetCallToolParams(payload["name"], tool_args=payload["tool_args"], ctx=ctx, tool=tool)


class _Transports(ParameterTransports):
    def __init__(self, capability: DurableTasksDurability[Any]) -> None:
        self.capability = capability

    def function_call(self, toolset: FunctionToolset[Any]) -> ParameterTransport[ToolsetCallToolParams, Any]:
        return _FunctionCallTransport(self.capability, toolset)

    async def prepare_function_call(
        self, toolset: FunctionToolset[Any], params: ToolsetCallToolParams
    ) -> ToolsetCallToolParams:
        # The arguments crossed as JSON: validate them again into the tool's Python types.
        return await revalidate_function_call(toolset, params, engine_spec=ENGINE_SPEC)
