"""OpenAI Agents SDK agents on durable_tasks: ``await DurableRunner(app).run(agent, input)``.

Tested with openai-agents 0.24.0. Call the runner inside a task and the run is durable; outside
a task it is ``Runner.run``::

    runner = DurableRunner(app, agents=[agent])    # registers the agents' tool tasks

    @app.task(name="agent.helper", queue="agents")
    async def run_helper(ctx: TaskContext[str], prompt: str) -> str:
        return str((await runner.run(agent, prompt)).final_output)

What each part becomes:

- ``Model.get_response`` is a journaled step of the task (every model of the run, through the
  run config's provider and the agents' own ``Model`` instances): a replay returns the recorded
  ``ModelResponse``;
- a ``FunctionTool`` call is a child task ``openai_agents.<agent>.tool.<tool>`` with idempotency
  key ``task:generation:slot`` and the tool's :class:`~durable_tasks.integrations.ToolPolicy`;
  the tool calls of one response start in the order the model gave them, and the parent holds
  no worker slot while they run. Inside the tool task the tool's errors retry per policy;
  invalid arguments (``ModelBehaviorError``) go back to the model at once; a tool that still
  fails goes to the model through the tool's ``failure_error_function``, or ends the run
  (``ToolPolicy.on_failure="fail"``). The tool gets a ``ToolContext`` whose ``context`` is None
  (the run's context object does not cross processes);
- a tool that ``needs_approval`` interrupts the run: the runner waits for the signal
  ``approval:<call id>`` (``#<n>`` added when the id was asked about before in the run;
  ``durable-tasks approvals``), approves or rejects, and resumes.

Streaming (``Runner.run_streamed``) is not durable: use ``run``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from agents import Agent, Model, ModelProvider, RunConfig, Runner, RunResult
from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse
from agents.models.multi_provider import MultiProvider
from agents.tool import FunctionTool, maybe_invoke_function_tool_failure_error_function
from agents.tool_context import ToolContext
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

__all__ = ["DurableRunner", "ToolPolicy"]


class DurableRunner:
    """Runs OpenAI Agents SDK agents durably inside a task (see the module doc)."""

    def __init__(
        self,
        app: App,
        *,
        queue: str = "agents",
        tool_policy: ToolPolicy = DEFAULT_POLICY,
        tool_policies: Mapping[str, ToolPolicy] | None = None,
        agents: Iterable[Agent[Any]] = (),
    ) -> None:
        """``agents`` (and the agents they hand off to) get their tool tasks registered now:
        every worker process that may run their tools must build the runner with them."""
        self.app = app
        self.queue = queue
        self.tool_policy = tool_policy
        self.tool_policies = dict(tool_policies or {})
        self._tools: dict[str, tuple[FunctionTool, ToolPolicy]] = {}
        for agent in agents:
            self.register(agent)

    def register(self, agent: Agent[Any]) -> None:
        """Register the tasks that run ``agent``'s function tools, and its handoffs' (idempotent)."""
        seen: set[int] = set()
        pending = [agent]
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            for tool in current.tools:
                if isinstance(tool, FunctionTool):
                    self._register_tool(current.name, tool)
            pending.extend(h for h in current.handoffs if isinstance(h, Agent))

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """``Runner.run`` made durable when called inside a task (plain ``Runner.run`` outside)."""
        journal = current_journal()
        if journal is None:
            return await Runner.run(starting_agent, input, **kwargs)
        self.register(starting_agent)
        turn = _Turn()
        run_config: RunConfig = kwargs.pop("run_config", None) or RunConfig()
        provider = run_config.model_provider or MultiProvider()
        run_config = dataclasses.replace(run_config, model_provider=_Provider(provider, journal, turn))
        agent = self._wrap(starting_agent, journal, turn, {})
        result = await Runner.run(agent, input, run_config=run_config, **kwargs)
        while result.interruptions:
            state = result.to_state()
            for position, item in enumerate(result.interruptions):
                decision = await journal.wait_signal(
                    approval_signal(journal, item.call_id),
                    kind=StepKind.APPROVAL,
                    request={"tool": item.tool_name, "args": _arguments(item.arguments), "tool_call_id": item.call_id},
                    order=position,
                )
                if isinstance(decision, dict) and decision.get("approved") is True:
                    state.approve(item)
                else:
                    reason = decision.get("reason") if isinstance(decision, dict) else None
                    state.reject(item, rejection_message=reason or None)
            result = await Runner.run(agent, state, run_config=run_config, **kwargs)
        return result

    # -- wrapping ------------------------------------------------------------------------

    def _wrap(self, agent: Agent[Any], journal: Journal, turn: _Turn, done: dict[int, Agent[Any]]) -> Agent[Any]:
        if id(agent) in done:
            return done[id(agent)]
        changes: dict[str, Any] = {}
        if isinstance(agent.model, Model):
            changes["model"] = _DurableModel(agent.model, journal, turn, agent.name)
        changes["tools"] = [
            self._wrap_tool(agent.name, tool, journal, turn) if isinstance(tool, FunctionTool) else tool
            for tool in agent.tools
        ]
        clone = agent.clone(**changes)
        done[id(agent)] = clone
        clone.handoffs = [self._wrap(h, journal, turn, done) if isinstance(h, Agent) else h for h in agent.handoffs]
        return clone

    def _wrap_tool(self, agent: str, tool: FunctionTool, journal: Journal, turn: _Turn) -> FunctionTool:
        task_name, policy = self._register_tool(agent, tool)

        async def invoke(ctx: ToolContext[Any], tool_input: str) -> Any:
            call_id = ctx.tool_call_id
            payload = {"tool": tool.name, "input": tool_input, "call_id": call_id}
            try:
                out = await journal.child(
                    task_name, payload, label=tool_label(tool.name, call_id, tool_input), order=turn.order(call_id)
                )
            except ChildTaskFailedError as exc:
                if not hands_to_model(policy, exc):
                    raise
                message = await maybe_invoke_function_tool_failure_error_function(
                    function_tool=tool, context=ctx, error=RuntimeError(failure_message(tool.name, exc))
                )
                if message is None:
                    raise
                return message
            return out["output"]

        return dataclasses.replace(tool, on_invoke_tool=invoke)

    def _register_tool(self, agent: str, tool: FunctionTool) -> tuple[str, ToolPolicy]:
        name = tool_task_name("openai_agents", agent, tool.name)
        policy = policy_for(tool.name, self.tool_policy, self.tool_policies)
        if name not in self.app.registry:
            self._tools[name] = (tool, policy)
            self.app.task(
                name=name,
                queue=self.queue,
                max_attempts=policy.max_attempts,
                timeout=policy.timeout,
                retry_on=policy.retry_on,
            )(self._tool_handler(name))
        return name, policy

    def _tool_handler(self, name: str) -> Any:
        async def run_tool(ctx: TaskContext[dict[str, Any]], payload: dict[str, Any]) -> dict[str, Any]:
            tool, _ = self._tools[name]
            tool_ctx: ToolContext[Any] = ToolContext(
                context=None,
                tool_name=tool.name,
                tool_call_id=payload["call_id"],
                tool_arguments=payload["input"],
            )
            # The tool's own failure handler would turn every error into a message for the model;
            # call past it so the task's retry policy sees the error first.
            invoke = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)
            try:
                output = await invoke(tool_ctx, payload["input"])
            except ModelBehaviorError as exc:  # invalid arguments: the model's mistake, not retried
                message = await maybe_invoke_function_tool_failure_error_function(
                    function_tool=tool, context=tool_ctx, error=exc
                )
                if message is None:
                    raise
                return {"output": message}
            return {"output": output if isinstance(output, str) else to_jsonable_python(output)}

        return run_tool


def _arguments(raw: Any) -> Any:
    """A call's arguments as JSON data (the model sends them as text)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


class _Turn:
    """The positions of the function calls of the latest model response (ordered starts)."""

    def __init__(self) -> None:
        self._positions: dict[str, int] = {}

    def saw(self, response: ModelResponse) -> None:
        calls = [item for item in response.output if getattr(item, "type", None) == "function_call"]
        self._positions = {str(getattr(call, "call_id", "")): i for i, call in enumerate(calls)}

    def order(self, call_id: str) -> int | None:
        return self._positions.get(call_id)


class _DurableModel(Model):
    """A model whose ``get_response`` is a journaled step."""

    def __init__(self, model: Model, journal: Journal, turn: _Turn, label: str) -> None:
        self.model = model
        self.journal = journal
        self.turn = turn
        self.label = label

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        async def call() -> ModelResponse:
            return await self.model.get_response(*args, **kwargs)

        response: ModelResponse = await self.journal.step(f"model:{self.label}", call, result_type=ModelResponse)
        self.turn.saw(response)
        return response

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("streaming is not durable: use DurableRunner.run")


class _Provider(ModelProvider):
    def __init__(self, provider: ModelProvider, journal: Journal, turn: _Turn) -> None:
        self.provider = provider
        self.journal = journal
        self.turn = turn

    def get_model(self, model_name: str | None) -> Model:
        return _DurableModel(self.provider.get_model(model_name), self.journal, self.turn, model_name or "default")
