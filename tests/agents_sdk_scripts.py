"""A scripted OpenAI Agents SDK ``Model`` for offline tests: ``script(turn, input) -> output``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

#: ``script(turn, input_items) -> output items``
Script = Callable[[int, list[Any]], list[Any]]


def call(name: str, call_id: str, **args: Any) -> ResponseFunctionToolCall:
    """A function call item, as the Responses API returns it."""
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=json.dumps(args))


def bad_call(name: str, call_id: str, raw: str) -> ResponseFunctionToolCall:
    """A function call whose arguments are whatever text the model produced."""
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=raw)


def say(text: str) -> ResponseOutputMessage:
    """A final assistant message."""
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def outputs(items: list[Any]) -> dict[str, str]:
    """The tool outputs in ``items`` (the model's input), by call id."""
    found: dict[str, str] = {}
    for item in items:
        data = item if isinstance(item, dict) else getattr(item, "model_dump", lambda: {})()
        if data.get("type") == "function_call_output":
            found[str(data["call_id"])] = str(data["output"])
    return found


class ScriptedModel(Model):
    """Answers from a script; counts its calls (``turns``)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.turns: list[int] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        turn = sum(1 for item in items if _is_output(item))
        self.turns.append(turn)
        return ModelResponse(output=self.script(len(self.turns) - 1, items), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _is_output(item: Any) -> bool:
    data = item if isinstance(item, dict) else {}
    return data.get("type") == "function_call_output"
