"""JSON, and only JSON: payloads and results are validated, bounded and serialized, or refused."""

from __future__ import annotations

import json
import warnings
from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter

from durable_tasks.codec import decode_payload, duplicate_key, encode_payload, encode_result
from durable_tasks.errors import (
    DurableTasksError,
    PayloadError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    ResultNotSerializableError,
)

MAX_BYTES = 64 * 1024
MAX_DEPTH = 64


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: int
    name: str
    tags: list[str] = []


class Measure(BaseModel):
    value: float


class Loose(BaseModel):
    data: Any


ANY: TypeAdapter[Any] = TypeAdapter(Any)
DICT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])
JOB: TypeAdapter[Job] = TypeAdapter(Job)
MEASURE: TypeAdapter[Measure] = TypeAdapter(Measure)
LOOSE: TypeAdapter[Loose] = TypeAdapter(Loose)
FLOAT: TypeAdapter[float] = TypeAdapter(float)


def payload(adapter: TypeAdapter[Any], value: Any, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> str:
    return encode_payload(adapter, value, task="demo.task", max_bytes=max_bytes, max_depth=max_depth)


def result(adapter: TypeAdapter[Any], value: Any, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> str:
    return encode_result(adapter, value, task="demo.task", max_bytes=max_bytes, max_depth=max_depth)


def nested(levels: int, leaf: Any) -> Any:
    """``leaf`` wrapped in ``levels`` lists."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


# -- what goes through ------------------------------------------------------------------


def test_valid_payload_is_compact_json_and_round_trips() -> None:
    text = payload(JOB, {"user_id": 7, "name": "ada", "tags": ["x"]})
    assert json.loads(text) == {"user_id": 7, "name": "ada", "tags": ["x"]}
    assert " " not in text
    assert decode_payload(JOB, text, task="demo.task") == Job(user_id=7, name="ada", tags=["x"])


def test_model_instance_and_dict_encode_the_same() -> None:
    assert payload(JOB, Job(user_id=1, name="n")) == payload(JOB, {"user_id": 1, "name": "n"})


def test_non_ascii_text_is_kept_as_text() -> None:
    text = payload(DICT, {"name": "Zoë ✓"})
    assert json.loads(text) == {"name": "Zoë ✓"}


# -- not plain JSON ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("adapter", "wrap"),
    [
        (MEASURE, lambda v: {"value": v}),
        (FLOAT, lambda v: v),
        (ANY, lambda v: v),
        (DICT, lambda v: {"score": v}),
        (LOOSE, lambda v: {"data": [1, v]}),
    ],
    ids=["float-field", "float", "untyped", "dict-of-any", "any-field"],
)
def test_nan_and_infinity_are_refused(adapter: TypeAdapter[Any], wrap: Any, bad: float) -> None:
    """Never turned into ``null`` (or anything else) behind the caller's back."""
    with pytest.raises(PayloadNotSerializableError) as exc_info:
        payload(adapter, wrap(bad))
    assert "NaN/Infinity" in str(exc_info.value)
    assert "demo.task" in str(exc_info.value)


@pytest.mark.parametrize(
    ("adapter", "value"),
    [
        (ANY, b"raw bytes"),
        (DICT, {"blob": b"raw bytes"}),
        (DICT, {"blob": b"\xff\xfe"}),
        (LOOSE, {"data": {"inner": [bytearray(b"abc")]}}),
    ],
    ids=["untyped", "dict-of-any", "dict-of-any-not-utf8", "any-field-bytearray"],
)
def test_bytes_are_refused(adapter: TypeAdapter[Any], value: Any) -> None:
    """Bytes are not JSON: refused, not silently decoded into a string."""
    with pytest.raises(PayloadNotSerializableError) as exc_info:
        payload(adapter, value)
    assert "bytes" in str(exc_info.value)


class Opaque:
    """An arbitrary object with no JSON form."""


@pytest.mark.parametrize(
    ("adapter", "value"),
    [(ANY, Opaque()), (DICT, {"o": Opaque()}), (LOOSE, {"data": [object()]}), (ANY, {"f": print})],
    ids=["untyped", "dict-of-any", "any-field", "function"],
)
def test_arbitrary_objects_are_refused(adapter: TypeAdapter[Any], value: Any) -> None:
    with pytest.raises(PayloadNotSerializableError) as exc_info:
        payload(adapter, value)
    assert "custom objects" in str(exc_info.value)


def test_not_serializable_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        payload(ANY, Opaque())
    assert issubclass(PayloadNotSerializableError, DurableTasksError)


# -- nesting -----------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, MAX_DEPTH * 2, 5_000, 100_000])
def test_too_deep_nesting_is_refused(levels: int) -> None:
    with pytest.raises(PayloadNotSerializableError):
        payload(ANY, nested(levels, 1))
    with pytest.raises(PayloadNotSerializableError):
        payload(LOOSE, {"data": nested(levels, 1)})


def test_deep_dicts_are_refused_like_deep_lists() -> None:
    value: Any = 1
    for _ in range(MAX_DEPTH + 1):
        value = {"k": value}
    with pytest.raises(PayloadNotSerializableError) as exc_info:
        payload(DICT, value)
    assert f"deeper than {MAX_DEPTH}" in str(exc_info.value)


def test_moderate_nesting_is_accepted() -> None:
    assert json.loads(payload(ANY, nested(10, {"a": [1, 2]}))) == nested(10, {"a": [1, 2]})


@pytest.mark.parametrize("leaf", [1, "s", None, True], ids=["int", "str", "null", "bool"])
def test_max_depth_counts_containers_whatever_the_leaf(leaf: Any) -> None:
    """``max_depth`` containers deep is allowed, one more is refused, and the leaf value does not
    change the depth: ``[[[1]]]`` is as deep as ``[[[]]]``."""
    depth = 4
    assert json.loads(payload(ANY, nested(depth - 1, []), max_depth=depth)) == nested(depth - 1, [])
    with pytest.raises(PayloadNotSerializableError):
        payload(ANY, nested(depth, []), max_depth=depth)
    assert json.loads(payload(ANY, nested(depth, leaf), max_depth=depth)) == nested(depth, leaf)
    with pytest.raises(PayloadNotSerializableError):
        payload(ANY, nested(depth + 1, leaf), max_depth=depth)


# -- size -------------------------------------------------------------------------------


def test_oversize_payload_is_refused_with_the_limit_and_advice() -> None:
    with pytest.raises(PayloadTooLargeError) as exc_info:
        payload(DICT, {"blob": "x" * 2000}, max_bytes=1024)
    message = str(exc_info.value)
    assert "max_payload_bytes=1024" in message
    assert "store large data elsewhere" in message


def test_payload_exactly_at_the_limit_is_accepted() -> None:
    value = {"blob": "x" * 100}
    size = len(payload(DICT, value).encode())
    assert payload(DICT, value, max_bytes=size)
    with pytest.raises(PayloadTooLargeError):
        payload(DICT, value, max_bytes=size - 1)


def test_size_is_counted_in_utf8_bytes_not_characters() -> None:
    value = {"s": "é" * 40}  # 48 characters of JSON, 88 bytes
    assert len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) < 64
    with pytest.raises(PayloadTooLargeError):
        payload(DICT, value, max_bytes=64)


# -- validation -------------------------------------------------------------------------


def test_missing_field_is_a_validation_error_naming_the_field() -> None:
    with pytest.raises(PayloadValidationError) as exc_info:
        payload(JOB, {"user_id": 1})
    message = str(exc_info.value)
    assert "demo.task" in message
    assert "name" in message
    assert "Field required" in message


def test_extra_field_is_refused_when_the_model_forbids_it() -> None:
    with pytest.raises(PayloadValidationError) as exc_info:
        payload(JOB, {"user_id": 1, "name": "n", "is_admin": True})
    assert "is_admin" in str(exc_info.value)


def test_extra_field_is_dropped_when_the_model_ignores_it() -> None:
    assert json.loads(payload(MEASURE, {"value": 1.5, "unit": "m"})) == {"value": 1.5}


@pytest.mark.parametrize(
    "value",
    [
        {"user_id": "not a number", "name": "n"},
        {"user_id": 1, "name": ["not", "a", "string"]},
        {"user_id": 1.5, "name": "n"},
        {"user_id": 1, "name": "n", "tags": "not-a-list"},
        [1, "n"],
        "a string",
        None,
    ],
    ids=["str-for-int", "list-for-str", "fraction-for-int", "str-for-list", "list-for-model", "str-for-model", "none"],
)
def test_wrong_typed_payload_is_a_validation_error(value: Any) -> None:
    with pytest.raises(PayloadValidationError) as exc_info:
        payload(JOB, value)
    assert "does not match its payload type" in str(exc_info.value)


def test_validation_error_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        payload(JOB, {})


def test_decoding_a_drifted_stored_payload_is_a_validation_error() -> None:
    for text in ['{"user_id":', '{"user_id": "x", "name": "n"}', "[]", ""]:
        with pytest.raises(PayloadValidationError):
            decode_payload(JOB, text, task="demo.task")


# -- results -----------------------------------------------------------------------------


def test_plain_result_is_serialized() -> None:
    assert json.loads(result(ANY, {"verdict": "AC", "time_ms": [1, 2]})) == {"verdict": "AC", "time_ms": [1, 2]}
    assert result(JOB, Job(user_id=1, name="n")) == '{"user_id":1,"name":"n","tags":[]}'


@pytest.mark.parametrize(
    ("adapter", "value"),
    [
        (ANY, Opaque()),
        (ANY, {"o": object()}),
        (ANY, float("nan")),
        (ANY, {"score": float("inf")}),
        (FLOAT, float("nan")),
        (ANY, b"raw"),
        (ANY, {"blob": b"\xff"}),
        (ANY, nested(MAX_DEPTH + 5, 1)),
        (ANY, nested(100_000, 1)),
    ],
    ids=[
        "object",
        "nested-object",
        "nan-untyped",
        "inf-in-dict",
        "nan-float",
        "bytes",
        "bytes-not-utf8",
        "too-deep",
        "far-too-deep",
    ],
)
def test_non_serializable_result_is_refused(adapter: TypeAdapter[Any], value: Any) -> None:
    with pytest.raises(ResultNotSerializableError) as exc_info:
        result(adapter, value)
    assert "demo.task" in str(exc_info.value)
    assert not isinstance(exc_info.value, PayloadError)


#: What ``errors="surrogateescape"`` makes of bytes that are not UTF-8 (a file name, a judged
#: program's output): text that UTF-8, and so the database, cannot hold.
LONE_SURROGATES = {
    "str": (ANY, "out\udcff"),
    "in-a-dict": (DICT, {"stdout": "\ud800"}),
    "in-a-model": (JOB, {"user_id": 1, "name": "x\udcffy"}),
}


@pytest.mark.parametrize(("adapter", "value"), LONE_SURROGATES.values(), ids=LONE_SURROGATES.keys())
def test_a_payload_with_a_lone_surrogate_is_refused_saying_where_and_what_to_do(
    adapter: TypeAdapter[Any], value: Any
) -> None:
    with pytest.raises(PayloadNotSerializableError, match="lone surrogate") as exc_info:
        payload(adapter, value)
    assert "errors='replace'" in str(exc_info.value)
    assert "\n" not in str(exc_info.value)


@pytest.mark.parametrize(
    ("adapter", "value"),
    [(ANY, "out\udcff"), (DICT, {"stdout": "\ud800"}), (JOB, Job(user_id=1, name="x\udcffy"))],
    ids=LONE_SURROGATES.keys(),
)
def test_a_result_with_a_lone_surrogate_is_refused_as_not_serializable(adapter: TypeAdapter[Any], value: Any) -> None:
    with pytest.raises(ResultNotSerializableError, match=r"lone surrogate|surrogates not allowed"):
        result(adapter, value)


def test_oversize_result_is_refused() -> None:
    with pytest.raises(ResultNotSerializableError) as exc_info:
        result(ANY, "x" * 2000, max_bytes=1024)
    assert "max_payload_bytes=1024" in str(exc_info.value)


# -- plain values: encoded as they are ---------------------------------------------------


class Verdict(StrEnum):
    AC = "AC"


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (dict[str, str], {"verdict": "AC", "note": "Zoë ✓"}),
        (dict[str, Any], {"time_ms": [1, 2.5, None, True], "by": {"judge": "j1"}}),
        (list[int], [1, 2, 3]),
        (list[dict[str, float]], [{"x": 1.0, "y": 1e300}]),
        (int | None, None),
        (int | None, 3),
        (str, "AC"),
        (float, 0.1),
        (None, None),
    ],
    ids=[
        "dict-str",
        "dict-any",
        "list-int",
        "list-dict-float",
        "none-of-optional",
        "int-of-optional",
        "str",
        "float",
        "none",
    ],
)
def test_a_plain_value_is_encoded_as_it_is_without_a_pydantic_dump(
    tp: Any, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value that is JSON as it is, of the types its schema names, skips pydantic's two dumps
    and the walks after them: the same compact text, and ``dump_python`` never called."""
    adapter: TypeAdapter[Any] = TypeAdapter(tp)
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    def no_dump(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("dumped through pydantic")

    monkeypatch.setattr(adapter, "dump_python", no_dump)
    assert result(adapter, value) == expected
    assert payload(adapter, value) == expected


@pytest.mark.parametrize(
    ("tp", "value", "text"),
    [
        (dict[str, int], {"n": True}, '{"n":1}'),  # a bool where an int is due: pydantic's int
        (list[float], [1], "[1.0]"),
        (dict[str, str], {"v": Verdict.AC}, '{"v":"AC"}'),
        (list[int], (1, 2), "[1,2]"),
        (dict[int, str], {1: "a"}, '{"1":"a"}'),
        (JOB, Job(user_id=1, name="n"), '{"user_id":1,"name":"n","tags":[]}'),
    ],
    ids=["bool-for-int", "int-for-float", "str-enum", "tuple-for-list", "int-keys", "model"],
)
def test_a_value_that_only_looks_plain_is_dumped_through_its_schema(tp: Any, value: Any, text: str) -> None:
    adapter = tp if isinstance(tp, TypeAdapter) else TypeAdapter(tp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns of the tuple given for a list
        assert result(adapter, value) == text


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (dict[str, float], {"x": float("nan")}),
        (list[float], [float("inf")]),
        (dict[str, Any], {"blob": b"raw"}),
        (dict[str, Any], {"x": [float("-inf")]}),
    ],
    ids=["nan-in-dict-float", "inf-in-list-float", "bytes-in-dict-any", "inf-nested"],
)
def test_nan_and_bytes_in_typed_containers_are_still_refused(tp: Any, value: Any) -> None:
    with pytest.raises(ResultNotSerializableError):
        result(TypeAdapter(tp), value)
    with pytest.raises(PayloadNotSerializableError):
        payload(TypeAdapter(tp), value)


def test_typed_containers_too_deep_are_refused_at_max_depth() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(list[Any])
    assert json.loads(result(adapter, nested(4, 1), max_depth=4)) == nested(4, 1)
    with pytest.raises(ResultNotSerializableError):
        result(adapter, nested(5, 1), max_depth=4)
    deep: TypeAdapter[Any] = TypeAdapter(dict[str, dict[str, dict[str, int]]])
    with pytest.raises(ResultNotSerializableError):
        result(deep, {"a": {"b": {"c": 1}}}, max_depth=2)


@pytest.mark.parametrize(
    "value", [2**53 + 1, 2**63, 2**64 + 1, -(2**70) - 1], ids=["2^53+1", "2^63", "2^64+1", "-2^70-1"]
)
def test_integers_past_double_and_int64_precision_round_trip_exactly(value: int) -> None:
    """Stored as JSON text, never through a float or a 64-bit column: nothing is rounded."""
    for adapter in (ANY, TypeAdapter(int)):
        text = payload(adapter, {"n": value} if adapter is ANY else value)
        back = decode_payload(adapter, text, task="demo.task")
        assert back == ({"n": value} if adapter is ANY else value)
        assert str(value) in text
    assert json.loads(result(ANY, [value])) == [value]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"a": 1, "a": 2}', "a"),
        ('{"a": 1, "b": 2, "a": 1}', "a"),  # the same value twice is still two keys
        ('{"a": {"x": 1}, "b": [{"y": 1, "y": 2}]}', "y"),  # at any depth, inside arrays
        ('{"name": 1, "n\\u0061me": 2}', "name"),  # an escape spells the same key
        ('{"a": 1, "b": {"a": 2}}', None),  # one key each in two objects
        ('[{"a": 1}, {"a": 1}]', None),
        ('{"A": 1, "a": 2}', None),  # keys compare exactly
        ("not json", None),  # left to the payload's validation
        ("[" * 10_000 + "]" * 10_000, None),  # too deep for the parser: left to validation too
    ],
)
def test_duplicate_key_finds_a_key_named_twice_in_one_object(text: str, key: str | None) -> None:
    assert duplicate_key(text) == key


def test_the_encoder_never_names_a_key_twice() -> None:
    text = payload(DICT, {"a": 1, "b": {"a": 2}})
    assert duplicate_key(text) is None
    assert json.loads(text) == {"a": 1, "b": {"a": 2}}
