"""JSON, and only JSON: payloads and results are validated, bounded and serialized here.

Never pickle. A value that is not plain JSON (NaN, bytes, arbitrary objects) is refused with a
typed error before anything is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from .errors import (
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    ResultNotSerializableError,
)

__all__ = ["decode_payload", "duplicate_key", "encode_payload", "encode_result", "json_depth", "utf8_length"]


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


#: ``check(value, depth)``: whether ``value`` is JSON as it is for one schema (see _plain_check).
_Check = Callable[[Any, int], bool]

_ANY_SCHEMA: dict[str, Any] = {"type": "any"}


def _plain_any(value: Any, depth: int) -> bool:
    """Whether ``value`` is JSON as it is: dicts with str keys, lists, str, int, bool, None and
    finite floats, exactly those types (no subclasses), at most ``depth`` containers deep."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if depth <= 0:
        return False
    if kind is dict:
        for key, item in value.items():  # noqa: SIM110 - a loop: all() over a generator costs more
            if type(key) is not str or not _plain_any(item, depth - 1):
                return False
        return True
    if kind is list:
        for item in value:  # noqa: SIM110 - as above
            if not _plain_any(item, depth - 1):
                return False
        return True
    return False


def _leaf_check(leaf: type) -> _Check:
    if leaf is float:
        return lambda value, depth: type(value) is float and math.isfinite(value)
    return lambda value, depth: type(value) is leaf


def _compile_check(schema: Any) -> _Check | None:
    """The check of :func:`_plain_check` for ``schema``; None for a schema it does not cover
    (models, unions, custom serializers, ...: those always take the full path)."""
    if "serialization" in schema:
        return None
    kind = schema["type"]
    if kind == "any":
        return _plain_any
    if kind in ("str", "int", "bool", "float"):
        return _leaf_check({"str": str, "int": int, "bool": bool, "float": float}[kind])
    if kind == "none":
        return lambda value, depth: value is None
    if kind == "nullable":
        inner = _compile_check(schema["schema"])
        return None if inner is None else (lambda value, depth: value is None or inner(value, depth))
    if kind == "dict":
        keys = schema.get("keys_schema", _ANY_SCHEMA)
        values = _compile_check(schema.get("values_schema", _ANY_SCHEMA))
        if values is None or keys["type"] not in ("str", "any") or "serialization" in keys:
            return None

        def check_dict(value: Any, depth: int) -> bool:
            if type(value) is not dict or depth <= 0:
                return False
            for key, item in value.items():  # noqa: SIM110 - as in _plain_any
                if type(key) is not str or not values(item, depth - 1):
                    return False
            return True

        return check_dict
    if kind == "list":
        items = _compile_check(schema.get("items_schema", _ANY_SCHEMA))
        if items is None:
            return None

        def check_list(value: Any, depth: int) -> bool:
            if type(value) is not list or depth <= 0:
                return False
            for item in value:  # noqa: SIM110 - as in _plain_any
                if not items(item, depth - 1):
                    return False
            return True

        return check_list
    return None


#: id(schema) -> (schema, its check): the schema is kept, so its id is not reused while cached.
_CHECKS: dict[int, tuple[Any, _Check | None]] = {}


def _plain_check(schema: Any) -> _Check | None:
    """A check of whether a value dumps in JSON mode to itself under ``schema``: no custom
    serializer, every leaf exactly the type its schema names (a bool where an int is due, a str
    subclass, a tuple or a set: no), floats finite, nested no deeper than the depth given. A
    value that passes is encoded as it is; any other takes the full path, which converts it
    or refuses it with the reason. Compiled once per schema."""
    cached = _CHECKS.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_CHECKS) >= 4096:  # adapters made and dropped over and over: start again
            _CHECKS.clear()
        cached = _CHECKS[id(schema)] = (schema, _compile_check(schema))
    return cached[1]


def _serialize(adapter: TypeAdapter[Any], obj: Any, max_depth: int) -> str:
    schema = adapter.core_schema
    check = _plain_check(schema)
    try:
        plain = check is not None and check(obj, max_depth)
    except RecursionError:  # a max_depth past the interpreter's stack: the iterative walks decide
        plain = False
    if plain:
        # The common cases (an int, a str, a dict[str, str] result): one walk and one encode,
        # instead of two dumps, the lossy-leaf walk and the depth walk, for the same text.
        return _ENCODER.encode(obj)
    if schema.get("type") == "any":
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
        size = utf8_length(text)
    except (ValueError, TypeError, RecursionError, PydanticSerializationError) as exc:
        raise PayloadNotSerializableError(
            f"payload for task {task!r} is not plain JSON ({exc}); pass strings, numbers, "
            "lists and objects only (no NaN/Infinity, bytes or custom objects)"
        ) from exc
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


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKeyError(key)
        seen.add(key)


def duplicate_key(text: str) -> str | None:
    """A key that appears twice in one object of the JSON ``text`` (at any depth), or None.
    Which of the two a reader takes differs between parsers (PostgreSQL's ``jsonb`` and pydantic
    keep the last; others keep the first, or refuse the text), so such a payload is ambiguous. ``App.submit``'s encoder
    never writes one; JSON written by a producer's own SQL (``dt_submit``) is checked with this.
    Text that is not JSON is left to the payload's validation (None)."""
    try:
        json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as found:
        return found.key
    except (ValueError, RecursionError):
        return None
    return None


def encode_result(adapter: TypeAdapter[Any], value: Any, *, task: str, max_bytes: int, max_depth: int) -> str:
    """Serialize a handler's return value, or raise ResultNotSerializableError."""
    try:
        text = _serialize(adapter, value, max_depth)
        size = utf8_length(text)
    except Exception as exc:
        raise ResultNotSerializableError(f"task {task!r} returned a value that is not plain JSON: {exc}") from exc
    if size > max_bytes:
        raise ResultNotSerializableError(
            f"task {task!r} returned {size} bytes of JSON, over max_payload_bytes={max_bytes}"
        )
    return text


def utf8_length(text: str) -> int:
    """The bytes of ``text`` in UTF-8, as the database stores it (ASCII text, most JSON, is
    counted without a copy). A lone surrogate (what ``errors="surrogateescape"`` makes of bytes
    that are not UTF-8: a file name, a process's output) has no UTF-8 form: ValueError, saying
    where."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"a lone surrogate {text[exc.start]!r} at character {exc.start} of its JSON is not text; decode "
            "bytes with errors='replace', or send them as base64"
        ) from exc
