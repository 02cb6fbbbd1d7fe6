"""JSON, and only JSON: payloads and results are validated, bounded and serialized here.

Never pickle. A value that is not plain JSON (NaN, bytes, arbitrary objects) is refused with a
typed error before anything is written.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from .errors import (
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    ResultNotSerializableError,
)

__all__ = ["decode_payload", "encode_payload", "encode_result", "json_depth"]


def json_depth(value: Any, limit: int) -> int:
    """How many containers deep a JSON-like value nests (``[[1]]`` is 2); stops past ``limit``."""
    depth, level = 0, [value]
    while depth <= limit:
        children: list[Any] = []
        found = False
        for item in level:
            if isinstance(item, dict):
                found = True
                children.extend(item.values())
            elif isinstance(item, list | tuple):
                found = True
                children.extend(item)
        if not found:
            break
        depth += 1
        level = children
    return depth


#: One encoder for every call (json.dumps with arguments builds a new one each time).
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _to_json(value: Any, max_depth: int) -> str:
    if json_depth(value, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return _ENCODER.encode(value)


def _refuse_lossy_leaves(value: Any) -> None:
    """pydantic's JSON mode silently turns NaN into null and bytes into text inside untyped
    fields; refuse both instead of storing something the caller did not send."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("NaN and Infinity are not JSON")
        if isinstance(item, bytes | bytearray | memoryview):
            raise ValueError("bytes are not JSON; encode them (base64) or store them elsewhere")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)


#: Plain schemas whose JSON is the value itself (no custom serializer can hide in them).
_SCALAR_SCHEMAS = {"int": int, "str": str, "bool": bool, "any": None}


def _serialize(adapter: TypeAdapter[Any], obj: Any, max_depth: int) -> str:
    schema = adapter.core_schema
    kind = schema.get("type")
    if (
        type(obj) in (int, str, bool)
        and kind in _SCALAR_SCHEMAS
        and "serialization" not in schema
        and _SCALAR_SCHEMAS[kind] in (None, type(obj))
    ):  # the common case, without two dumps and a walk
        return _ENCODER.encode(obj)
    if kind == "any":
        return _to_json(obj, max_depth)  # untyped: plain JSON only, no implicit conversions
    _refuse_lossy_leaves(adapter.dump_python(obj, mode="python"))
    return _to_json(adapter.dump_python(obj, mode="json"), max_depth)


def encode_payload(adapter: TypeAdapter[Any], value: Any, *, task: str, max_bytes: int, max_depth: int) -> str:
    """Validate ``value`` against the task's payload type and serialize it."""
    try:
        obj = adapter.validate_python(value)
    except ValidationError as exc:
        raise PayloadValidationError(
            f"payload for task {task!r} does not match its payload type: {exc.error_count()} error(s):\n{exc}"
        ) from exc
    try:
        text = _serialize(adapter, obj, max_depth)
    except (ValueError, TypeError, RecursionError, PydanticSerializationError) as exc:
        raise PayloadNotSerializableError(
            f"payload for task {task!r} is not plain JSON ({exc}); pass strings, numbers, "
            "lists and objects only (no NaN/Infinity, bytes or custom objects)"
        ) from exc
    size = len(text.encode())
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"payload for task {task!r} is {size} bytes, over max_payload_bytes={max_bytes}; "
            "store large data elsewhere (object storage, a table) and pass its key"
        )
    return text


def decode_payload(adapter: TypeAdapter[Any], text: str, *, task: str) -> Any:
    """Rebuild the payload object from its stored JSON (PayloadValidationError if it drifted)."""
    try:
        return adapter.validate_json(text)
    except ValidationError as exc:
        raise PayloadValidationError(f"stored payload of task {task!r} no longer validates: {exc}") from exc


def encode_result(adapter: TypeAdapter[Any], value: Any, *, task: str, max_bytes: int, max_depth: int) -> str:
    """Serialize a handler's return value, or raise ResultNotSerializableError."""
    try:
        text = _serialize(adapter, value, max_depth)
    except Exception as exc:
        raise ResultNotSerializableError(f"task {task!r} returned a value that is not plain JSON: {exc}") from exc
    if len(text.encode()) > max_bytes:
        raise ResultNotSerializableError(
            f"task {task!r} returned {len(text.encode())} bytes of JSON, over max_payload_bytes={max_bytes}"
        )
    return text
