"""Each task state has one place in the partial indexes of dt_tasks (durable_tasks.state_indexes)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from durable_tasks.records import TaskState, tasks_table
from durable_tasks.state_indexes import OFF_PATH, SENT, indexed_by_state, predicate


def test_every_state_but_success_is_in_exactly_one_index_by_state() -> None:
    """A state added to TaskState fails here until it is placed: off the hot path (one entry per
    task that rests in it) or sent; only SUCCEEDED, every task's last state, is in neither."""
    placed = [*SENT, *OFF_PATH]
    assert len(placed) == len(set(placed))
    assert set(placed) | {TaskState.SUCCEEDED.value} == {s.value for s in TaskState}
    assert TaskState.SUCCEEDED.value not in placed


def test_the_postgres_indexes_are_declared_with_the_same_predicates_queries_repeat() -> None:
    options = [(ix.name, ix.dialect_options["postgresql"].get("where")) for ix in tasks_table.indexes]
    where = {str(name): str(predicate_) for name, predicate_ in options if predicate_ is not None}
    assert where["ix_dt_tasks_state"] == predicate(OFF_PATH)
    assert where["ix_dt_tasks_sent"] == predicate(SENT)
    pending = indexed_by_state("PENDING")
    assert pending is not None
    statement = sa.select(tasks_table.c.id).where(tasks_table.c.state == "PENDING", pending)
    compiled = str(statement.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
    assert f"({predicate(OFF_PATH, 'dt_tasks.state')})" in compiled
    assert str(indexed_by_state("RUNNING")) == f"({predicate(SENT, 'dt_tasks.state')})"
    assert indexed_by_state("SUCCEEDED") is None
