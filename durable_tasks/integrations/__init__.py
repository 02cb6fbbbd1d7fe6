"""Agent-framework integrations: thin adapters over the step journal (:mod:`durable_tasks.journal`).

- :mod:`.pydantic_ai`: ``DurableTasksDurability(app)``, a capability for ``pydantic_ai.Agent``
  (extra ``durable-tasks[pydantic-ai]``);
- :mod:`.openai_agents`: ``DurableRunner(app).run(agent, input)`` for the OpenAI Agents SDK
  (extra ``durable-tasks[openai-agents]``).

Both follow one shape: the agent run executes inside a durable task; every model request is a
journaled step of that task (a replay returns the recorded response, so a finished turn never
reaches the model again); every function-tool call is a child task keyed
``task:generation:slot`` with its own retry and timeout policy, started in the order the model
asked for them; the parent holds no worker slot while its tools run; approvals are signals.
"""

from __future__ import annotations

from ._policy import FailureMode, ToolPolicy

__all__ = ["FailureMode", "ToolPolicy"]
