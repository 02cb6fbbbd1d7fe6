"""The Postgres statements kept as named resources (store/sql/postgres.sql)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durable_tasks.store import sql

PACKAGE = Path(sql.__file__).resolve().parents[1]


def test_a_file_of_named_statements_splits_into_statements_without_comments() -> None:
    text = """-- header comment
-- name: first
-- what it does
SELECT 1;

-- name: second
UPDATE t SET a = %(a)s  -- the text after SQL stays
WHERE id = ANY(%(ids)s::text[]);
"""
    assert sql.parse(text) == {
        "first": "SELECT 1",
        "second": "UPDATE t SET a = %(a)s  -- the text after SQL stays\nWHERE id = ANY(%(ids)s::text[])",
    }


@pytest.mark.parametrize(
    "text", ["-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;", "-- name: empty\n-- only a comment\n"]
)
def test_a_duplicated_or_empty_name_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duplicated or empty"):
        sql.parse(text)


def test_every_statement_the_code_names_exists_and_every_statement_is_used() -> None:
    used = set()
    for source in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r'sql\.postgres\(\)\["(\w+)"\]', source.read_text(encoding="utf-8")))
    assert used == set(sql.postgres())
