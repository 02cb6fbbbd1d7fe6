"""The Postgres statements kept as named resources (store/sql/postgres.sql)."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durable_tasks.journal import PendingChild, PreparedChild
from durable_tasks.store import sql
from durable_tasks.store.journal import child_task
from durable_tasks.store.postgres import submits
from tests.helpers import first_attempt

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


def test_a_suspensions_children_statement_refuses_tasks_that_are_not_one_parents_children() -> None:
    """It takes what the children share (namespace, parent, trace context, shadow) once: tasks
    that differ there, or carry a partition or concurrency key, are refused, not misfiled."""
    claim = first_attempt("ns", "p", datetime.now(UTC), name="parent")
    children = [
        child_task(
            claim, PendingChild(f"c:{i}", "c", PreparedChild("double", str(i)), (0, i)), queue="q", max_attempts=3
        )
        for i in range(2)
    ]
    now = datetime.now(UTC)
    assert submits.submit_children(children, ["a", "b"], now).params["slots"] == ["c:0", "c:1"]
    for odd in (
        dataclasses.replace(children[1], parent_id="other"),
        dataclasses.replace(children[1], shadow=True),
        dataclasses.replace(children[1], concurrency_key="k"),
    ):
        with pytest.raises(ValueError, match="one suspension"):
            submits.submit_children([children[0], odd], ["a", "b"], now)
