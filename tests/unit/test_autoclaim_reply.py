"""``parse_autoclaim_reply`` normalizes XAUTOCLAIM replies of every server version.

Redis 6.2 replies ``[cursor, entries]``; an entry deleted from the stream while pending comes
back as nil *instead of* the entry (the server does not name it; redis-py turns that nil into
``(None, None)``), and it stays in the PEL. Redis/Valkey 7.0+ reply
``[cursor, entries, deleted_ids]`` and have already dropped those ids from the PEL. Fields
arrive as a dict (redis-py parsed them) or as a flat ``[field, value, ...]`` list (raw reply).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from durable_tasks.transport.messages import AutoclaimPage, parse_autoclaim_reply

STREAM_ID = re.compile(r"^\d+-\d+$")

FIELDS = {"t": "5b0c3a3e-4f57-4d3c-9a55-0f8f0e6f1c11", "g": "0", "d": "2", "n": "judge"}
FLAT = [x for kv in FIELDS.items() for x in kv]


def _assert_ids_are_stream_ids(page: AutoclaimPage) -> None:
    for entry_id, _ in page.entries:
        assert STREAM_ID.match(entry_id), entry_id
    for entry_id in page.deleted:
        assert STREAM_ID.match(entry_id), f"deleted holds {entry_id!r}, which is not a stream id"


# -- Redis / Valkey 7.0+: three elements ------------------------------------------------------


@pytest.mark.parametrize("fields", [FIELDS, FLAT], ids=["dict", "flat-list"])
def test_three_element_reply(fields: Any) -> None:
    page = parse_autoclaim_reply(["1700000000123-4", [["1700000000000-0", fields]], ["1699999999999-7"]])
    assert page == AutoclaimPage("1700000000123-4", [("1700000000000-0", FIELDS)], ["1699999999999-7"])


def test_three_element_reply_as_redis_py_returns_it() -> None:
    # redis-py 5+ parses entries into (id, dict) tuples and leaves the deleted ids as a list.
    reply = ["0-0", [("1-0", dict(FIELDS)), ("2-0", {"t": "x", "g": "1", "d": "0", "n": "y"})], ["3-0", "4-1"]]
    page = parse_autoclaim_reply(reply)
    assert page.cursor == "0-0"
    assert page.entries == [("1-0", FIELDS), ("2-0", {"t": "x", "g": "1", "d": "0", "n": "y"})]
    assert page.deleted == ["3-0", "4-1"]


def test_three_element_reply_with_nothing_deleted_or_claimed() -> None:
    assert parse_autoclaim_reply(["0-0", [], []]) == AutoclaimPage("0-0", [], [])


def test_field_values_are_strings() -> None:
    page = parse_autoclaim_reply(["0-0", [["1-0", {"g": 3, "d": 0}]], []])
    assert page.entries == [("1-0", {"g": "3", "d": "0"})]


def test_only_deleted_entries() -> None:
    page = parse_autoclaim_reply(["0-0", [], ["5-0", "6-0"]])
    assert page.entries == []
    assert page.deleted == ["5-0", "6-0"]


# -- Redis 6.2: two elements -----------------------------------------------------------------


@pytest.mark.parametrize("fields", [FIELDS, FLAT], ids=["dict", "flat-list"])
def test_two_element_reply(fields: Any) -> None:
    page = parse_autoclaim_reply(["12-0", [["10-0", fields], ["11-0", fields]]])
    assert page == AutoclaimPage("12-0", [("10-0", FIELDS), ("11-0", FIELDS)], [])


def test_two_element_reply_with_no_entries() -> None:
    assert parse_autoclaim_reply(["0-0", []]) == AutoclaimPage("0-0", [], [])
    assert parse_autoclaim_reply(["0-0", None]) == AutoclaimPage("0-0", [], [])


@pytest.mark.parametrize("fields", [FIELDS, FLAT], ids=["dict", "flat-list"])
def test_two_element_reply_with_an_entry_without_fields(fields: Any) -> None:
    # A deleted entry that keeps its id and has None for fields: reported as deleted.
    page = parse_autoclaim_reply(["0-0", [["1-0", fields], ["2-0", None], ["3-0", fields]]])
    assert page.entries == [("1-0", FIELDS), ("3-0", FIELDS)]
    assert page.deleted == ["2-0"]


def test_two_element_reply_with_a_nil_element_as_redis_62_sends_it() -> None:
    # The 6.2 wire reply: the deleted entry is a whole nil, no id. Claimed entries must still be
    # parsed, and nothing may be reported as deleted that is not a stream id.
    page = parse_autoclaim_reply(["0-0", [["1-0", FLAT], None, ["3-0", FLAT]]])
    assert page.cursor == "0-0"
    assert page.entries == [("1-0", FIELDS), ("3-0", FIELDS)]
    _assert_ids_are_stream_ids(page)


def test_two_element_reply_with_a_nil_element_as_redis_py_returns_it() -> None:
    # redis-py turns the 6.2 nil element into (None, None).
    page = parse_autoclaim_reply(["0-0", [("1-0", dict(FIELDS)), (None, None)]])
    assert page.entries == [("1-0", FIELDS)]
    _assert_ids_are_stream_ids(page)
