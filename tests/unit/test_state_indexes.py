"""What the indexes of dt_tasks that name state hold, and what queries repeat (durable_tasks.state_indexes)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from durable_tasks.records import TERMINAL_STATES, TaskState, tasks_table
from durable_tasks.state_indexes import (
    SENT,
    STATE_INDEX_LEAVES_OUT,
    indexed_by_state,
    predicate,
    sent_tasks,
    state_predicate,
)


def test_the_state_index_leaves_out_only_the_history_and_the_sent_index_the_delivered_tasks() -> None:
    assert TaskState.SUCCEEDED.value == STATE_INDEX_LEAVES_OUT
    assert STATE_INDEX_LEAVES_OUT in TERMINAL_STATES
    assert {TaskState(s) for s in SENT} == {TaskState.ENQUEUED, TaskState.RUNNING}
    for state in TaskState:
        assert (indexed_by_state(state) == []) == (state == TaskState.SUCCEEDED), state


def test_the_postgres_indexes_are_declared_with_the_predicates_queries_repeat() -> None:
    options = [(ix.name, ix.dialect_options["postgresql"].get("where")) for ix in tasks_table.indexes]
    where = {str(name): str(predicate_) for name, predicate_ in options if predicate_ is not None}
    assert where["ix_dt_tasks_state"] == state_predicate() == "state <> 'SUCCEEDED'"
    assert where["ix_dt_tasks_sent"] == predicate(SENT)
    running = indexed_by_state(TaskState.RUNNING)
    statement = sa.select(tasks_table.c.id).where(tasks_table.c.state == TaskState.RUNNING, *running, sent_tasks())
    compiled = str(statement.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
    assert f"({state_predicate('dt_tasks.state')})" in compiled
    assert f"({predicate(SENT, 'dt_tasks.state')})" in compiled
