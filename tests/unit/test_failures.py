"""Failure records: the traceback is kept whole up to its bound, its end when cut, and no
password of a URL or DSN in an exception's text survives into what is stored or logged."""

from __future__ import annotations

import pytest

from durable_tasks.failures import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, Failure, scrub


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "cannot connect to redis://:s3cret@cache:6379/0 (refused)",
            "cannot connect to redis://:***@cache:6379/0 (refused)",
        ),
        (
            "postgresql+psycopg://app:s3cret@db/prod failed",
            "postgresql+psycopg://app:***@db/prod failed",
        ),
        ("dsn 'host=db user=app password=s3cret dbname=x'", "dsn 'host=db user=app password=*** dbname=x'"),
        ("connect(password='s3cret', host='db')", "connect(password='***', host='db')"),
        ("https://h/x?user=a&password=s3cret&x=1", "https://h/x?user=a&password=***&x=1"),
        ("nothing to hide: ValueError at line 3", "nothing to hide: ValueError at line 3"),
        ("first pass: 3 errors; bypass=on", "first pass: 3 errors; bypass=on"),
        ("{'password': 's3cret'}", "{'password': '***'}"),
        ("redis?pass=s3cret", "redis?pass=***"),
    ],
)
def test_scrub_masks_passwords_in_free_text_and_keeps_the_rest(text: str, shown: str) -> None:
    assert scrub(text) == shown
    assert "s3cret" not in scrub(text)


def test_a_failure_keeps_type_message_and_the_end_of_a_long_traceback() -> None:
    try:
        try:
            raise KeyError("a cause far longer than the bound " * 1000)
        except KeyError as cause:
            raise ValueError("the last line survives") from cause
    except ValueError as exc:
        failure = Failure.of(exc)
    assert (failure.error_type, failure.message, failure.in_hook) == ("ValueError", "the last line survives", False)
    assert len(failure.traceback) == MAX_TRACEBACK_CHARS
    assert failure.traceback.startswith("[")
    assert "characters cut]" in failure.traceback.splitlines()[0]
    assert failure.traceback.rstrip().endswith("ValueError: the last line survives")


def test_a_short_traceback_is_kept_whole_with_its_chained_cause() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer with redis://:s3cret@h/0") from inner
    except RuntimeError as exc:
        failure = Failure.of(exc, in_hook=True)
    assert failure.in_hook
    assert "KeyError: 'inner'" in failure.traceback
    assert "The above exception was the direct cause" in failure.traceback
    assert failure.message == "outer with redis://:***@h/0"
    assert "s3cret" not in failure.traceback


def test_a_long_message_keeps_its_start() -> None:
    failure = Failure.of(ValueError("x" * (MAX_MESSAGE_CHARS + 10)))
    assert failure.message == "x" * MAX_MESSAGE_CHARS
    assert failure.traceback == f"ValueError: {'x' * (MAX_MESSAGE_CHARS + 10)}\n"
