"""Durations in settings: seconds, text with a unit, ISO 8601; retention may be off."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durable_tasks.settings import Settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.5", timedelta(seconds=2.5)),
        ("7d", timedelta(days=7)),
        ("12h", timedelta(hours=12)),
        ("30m", timedelta(minutes=30)),
        ("45s", timedelta(seconds=45)),
        ("500ms", timedelta(milliseconds=500)),
        ("2w", timedelta(weeks=2)),
        ("PT2S", timedelta(seconds=2)),
    ],
)
def test_a_duration_reads_seconds_units_and_iso_8601(text: str, expected: timedelta) -> None:
    assert Settings(visibility_timeout=text).visibility_timeout == expected  # type: ignore[arg-type]


def test_retention_is_off_by_default_and_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().retention is None
    monkeypatch.setenv("DT_RETENTION", "7d")
    assert Settings().retention == timedelta(days=7)
    monkeypatch.setenv("DT_RETENTION", "off")
    assert Settings().retention is None
