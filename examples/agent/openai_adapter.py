"""A ChatModel over any OpenAI-style chat-completions function, and a replay of recorded ones.

``OpenAIChatModel(create)`` takes ``create(request: dict) -> dict``: with the official client
that is ``lambda req: client.chat.completions.create(**req).model_dump()``; in tests and demos
it is ``ReplayCompletions(path)``, which answers from a recorded JSON fixture (no network).

The model call runs inside the agent's *turn task*: it is retried if it raises, and its
output is recorded once, in the turn's fenced result transaction, so a recovered run never
pays for a finished turn twice.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from durable_tasks.agents import ModelTurn, ToolCall, ToolSpec

__all__ = ["INVALID_JSON_KEY", "CreateFn", "OpenAIChatModel", "ReplayCompletions", "ReplayExhaustedError"]

#: ``create(request) -> response``, in OpenAI's chat-completions shapes.
CreateFn = Callable[[dict[str, Any]], dict[str, Any]]

#: Arguments that are not a JSON object arrive at the tool as ``{INVALID_JSON_KEY: raw}``; the
#: tool's argument validation rejects them and the model reads the error in the next turn.
INVALID_JSON_KEY = "__invalid_json__"


class OpenAIChatModel:
    """The agents ``ChatModel`` protocol over an OpenAI-style ``create`` function."""

    def __init__(
        self, create: CreateFn, *, model: str = "gpt-4o-mini", temperature: float | None = 0.0, **extra: Any
    ) -> None:
        self.create = create
        self.model = model
        self.temperature = temperature
        self.extra = extra

    def complete(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> ModelTurn:
        """One chat completion: messages and tools in, the assistant's turn out."""
        return self.parse_response(self.create(self.build_request(messages, tools)))

    def build_request(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The request body: ``model``, ``messages``, ``tools`` (function tools), extras."""
        request: dict[str, Any] = {"model": self.model, "messages": [_clean(m) for m in messages]}
        if tools:
            request["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        if self.temperature is not None:
            request["temperature"] = self.temperature
        return request | self.extra

    @staticmethod
    def parse_response(response: dict[str, Any]) -> ModelTurn:
        """``choices[0].message`` as a ModelTurn; unparseable arguments become
        ``{"__invalid_json__": raw}`` instead of an exception."""
        try:
            message = response["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"not a chat completion response: {str(response)[:200]}") from exc
        calls = []
        for call in message.get("tool_calls") or []:
            if call.get("type", "function") != "function":
                continue  # other tool kinds are not ours to run
            function = call.get("function") or {}
            calls.append(
                ToolCall(
                    id=str(call["id"]),
                    name=str(function.get("name", "")),
                    arguments=_arguments(function.get("arguments")),
                )
            )
        content = message.get("content")
        return ModelTurn(content=content if isinstance(content, str) else None, tool_calls=calls)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):  # some OpenAI-compatible servers send an object already
        return raw
    if raw is None or raw == "":
        return {}
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return {INVALID_JSON_KEY: str(raw)}
    return parsed if isinstance(parsed, dict) else {INVALID_JSON_KEY: str(raw)}


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI rejects an empty ``tool_calls`` list on an assistant message: drop it."""
    if "tool_calls" in message and not message["tool_calls"]:
        return {k: v for k, v in message.items() if k != "tool_calls"}
    return dict(message)


class ReplayExhaustedError(RuntimeError):
    """The fixture has no response left for this request."""


class ReplayCompletions:
    """A ``create`` function that answers with recorded responses, in order.

    The fixture is a JSON file ``{"responses": [response, ...]}`` (or a bare list). Every
    request is recorded in :attr:`requests` (a deep copy), so a test can check what was sent.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        data = json.loads(self.path.read_text(encoding="utf-8"))
        responses = data["responses"] if isinstance(data, dict) else data
        if not isinstance(responses, list):
            raise ValueError(f"{self.path}: expected a list of responses")
        self.responses: list[dict[str, Any]] = responses
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # tool and turn tasks run in worker threads

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            index = len(self.requests)
            self.requests.append(copy.deepcopy(request))
            if index >= len(self.responses):
                raise ReplayExhaustedError(f"{self.path.name}: no recorded response #{index}")
            return copy.deepcopy(self.responses[index])
