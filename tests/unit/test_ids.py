"""Task ids are UUIDv7: RFC 9562's layout, text order = time order, random within a millisecond."""

from __future__ import annotations

import uuid

import pytest

from durable_tasks.store import ids
from durable_tasks.store.ids import new_task_id


def test_a_task_id_is_a_version_7_uuid_of_36_characters() -> None:
    task_id = new_task_id()
    parsed = uuid.UUID(task_id)
    assert (len(task_id), parsed.version, parsed.variant) == (36, 7, uuid.RFC_4122)


def test_its_first_48_bits_are_the_milliseconds_and_later_ids_sort_after(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_796_000_000_000_000_000]  # ns
    monkeypatch.setattr(ids, "_now_ns", lambda: now[0])
    first = new_task_id()
    assert uuid.UUID(first).int >> 80 == 1_796_000_000_000
    now[0] += 1_000_000  # one millisecond later
    later = [new_task_id() for _ in range(100)]
    assert all(first < t for t in later)  # as text, as the index orders them


def test_ids_made_in_the_same_millisecond_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids, "_now_ns", lambda: 1_796_000_000_000_000_000)
    made = {new_task_id() for _ in range(10_000)}
    assert len(made) == 10_000
