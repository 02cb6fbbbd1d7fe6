"""Paging shared by every list of the read model: a page, its cursor, stored times as UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from ..errors import InvalidQueryError

__all__ = ["COUNT_CAP", "MAX_NAMES", "PAGE_SIZE", "Page", "decode_cursor", "encode_cursor", "utc"]

#: Rows per page of every list.
PAGE_SIZE = 50
#: A count stops here ("10,000+"): the cost of a count is bounded by the cap, not the table.
COUNT_CAP = 10_000
#: The loose index scan of task names stops here.
MAX_NAMES = 1_000

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list, and the cursor of the next page (None on the last)."""

    items: list[T]
    next_cursor: str | None


def encode_cursor(at: datetime, key: str) -> str:
    """The cursor after a row: its sort time and its id."""
    return f"{at.isoformat()}|{key}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (time, id) a cursor names; InvalidQueryError for text that is not a cursor."""
    at, sep, key = cursor.partition("|")
    try:
        if not sep or not key:
            raise ValueError(cursor)
        return datetime.fromisoformat(at), key
    except ValueError:
        raise InvalidQueryError(f"{cursor[:60]!r} is not a page cursor; start from the first page") from None


def utc(value: datetime | None) -> datetime | None:
    """A stored time as aware UTC (SQLite and timestamp columns hand back naive UTC)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
