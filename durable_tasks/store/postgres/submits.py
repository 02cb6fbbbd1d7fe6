"""PostgreSQL's submits as values (``sql/postgres.sql``), run inside the caller's transaction:
a task, a batch of one task's intents, a suspension's children (alone, or with the whole
suspension on children: its fence and its waits). Each is ONE statement that
writes the task rows, their first outbox rows and the dispatchers' wake-up (a NOTIFY
delivered at commit); a batch travels as parallel arrays, so the statement text never changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...journal import PendingChild
from .. import sql
from ..execution import ExecutionClaim
from ..submit import NewTask, task_row
from .statements import NOTIFY_CHANNEL, OneStatement, Rows, wait_fenced

__all__ = ["submit_children", "submit_task", "submit_tasks", "suspend_on_children"]

#: The columns of a task row that submit_task writes from its NewTask.
_SUBMIT_COLUMNS = (
    "id",
    "namespace",
    "name",
    "queue",
    "idempotency_key",
    "payload",
    "payload_bytes",
    "max_attempts",
    "traceparent",
    "partition_key",
    "priority",
    "concurrency_key",
    "shadow",
    "parent_id",
    "parent_generation",
    "parent_slot",
)

#: What a suspension's children share: their parent's (journal.child_task).
_PARENTS = ("namespace", "traceparent", "shadow", "parent_id", "parent_generation")


def submit_task(task: NewTask, task_id: str, now: datetime) -> OneStatement[bool]:
    """A new task, its first outbox row and the dispatchers' wake-up; reads False when the
    idempotency key was taken (nothing written)."""
    row = task_row(task, task_id, now)
    params = {key: row[key] for key in _SUBMIT_COLUMNS} | {
        "now": now,
        "due": task.due or now,
        "channel": NOTIFY_CHANNEL,
    }
    return OneStatement(sql.postgres()["submit_task"], params, bool)


def submit_tasks(tasks: Sequence[NewTask], task_ids: Sequence[str], now: datetime) -> OneStatement[Rows]:
    """Several tasks of one name, their first outbox rows and the dispatchers' wake-up: one row
    per task, in order (id of the task holding its key or NULL, created, generation)."""
    first = tasks[0]
    params = {
        "namespace": first.namespace,
        "name": first.name,
        "queue": first.queue,
        "max_attempts": first.max_attempts,
        "shadow": first.shadow,
        "priority": first.priority,
        "concurrency_key": first.concurrency_key,
        "now": now,
        "channel": NOTIFY_CHANNEL,
        "ids": list(task_ids),
        "keys": [t.idempotency_key for t in tasks],
        "payloads": [t.payload_json for t in tasks],
        "payload_sizes": [t.payload_bytes for t in tasks],
        "traceparents": [t.traceparent for t in tasks],
        "partition_keys": [t.partition_key for t in tasks],
        "dues": [t.due or now for t in tasks],
    }
    return OneStatement(sql.postgres()["submit_tasks"], params, _rows)


def submit_children(tasks: Sequence[NewTask], task_ids: Sequence[str], now: datetime) -> OneStatement[Rows]:
    """A suspension's new children (of one parent, as :func:`..journal.child_task` makes them),
    their first outbox rows and the dispatchers' wake-up: one row per child, in order (id of
    the task holding its key or NULL, created, generation). ValueError for tasks that are not
    one parent's children (the statement takes what they share once)."""
    params = {key: getattr(tasks[0], key) for key in _PARENTS} | _children(tasks, task_ids, now)
    return OneStatement(sql.postgres()["submit_children"], params, _rows)


def suspend_on_children(
    claim: ExecutionClaim, children: Sequence[tuple[PendingChild, NewTask]], task_ids: Sequence[str], now: datetime
) -> OneStatement[Rows]:
    """A suspension that waits on ``children`` alone (postgres.sql: suspend_on_children): the
    fence to WAITING and the attempt closed, the children written as :func:`submit_children`
    writes them, their waits opened. One row per child, in order (id of the task holding its
    key, created, generation); none when the fence did not hold."""
    tasks = [task for _, task in children]
    if tasks[0].parent_id != claim.task_id:
        raise ValueError("suspend_on_children takes the children of the claim's task")
    params = {
        **_children(tasks, task_ids, now),
        **wait_fenced(claim, now).params,  # the fence, and the attempt's close as suspended
        "traceparent": claim.traceparent,
        "shadow": claim.shadow,
        "labels": [child.label[:200] for child, _ in children],
    }
    return OneStatement(sql.postgres()["suspend_on_children"], params, _rows)


def _children(tasks: Sequence[NewTask], task_ids: Sequence[str], now: datetime) -> dict[str, Any]:
    """A suspension's children as parallel arrays; ValueError unless they are one parent's
    children (:func:`..journal.child_task`: what they share is taken once)."""
    first = tasks[0]
    shared = {key: getattr(first, key) for key in _PARENTS}
    if first.parent_id is None or any(
        t.partition_key is not None
        or t.concurrency_key is not None
        or any(getattr(t, key) != value for key, value in shared.items())
        for t in tasks
    ):
        raise ValueError("submit_children takes the children of one suspension (journal.child_task)")
    return {
        "now": now,
        "channel": NOTIFY_CHANNEL,
        "ids": list(task_ids),
        "names": [t.name for t in tasks],
        "queues": [t.queue for t in tasks],
        "keys": [t.idempotency_key for t in tasks],
        "payloads": [t.payload_json for t in tasks],
        "payload_sizes": [t.payload_bytes for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "priorities": [t.priority for t in tasks],
        "slots": [t.parent_slot for t in tasks],
        "dues": [t.due or now for t in tasks],
    }


def _rows(rows: Rows) -> Rows:
    return rows
