"""The read model: the queries an operator's view runs (CLI, dashboard, doctor), in one place.

Every list is keyed and paged (newest first, a cursor names the last row shown: no OFFSET);
every count is capped (``COUNT_CAP``), so no view counts the whole history on each refresh.
Functions take an engine and a namespace and return plain dataclasses or mappings; what
Redis knows (consumers) is read through the transport. Nothing here writes.
"""

from .agent_runs import AgentRunDetail, agent_run, agent_runs
from .approvals import JournalRun, journal_run, open_approvals
from .audit import audit_entries
from .paging import COUNT_CAP, PAGE_SIZE, Page, decode_cursor, encode_cursor
from .tasks import (
    FinishedRow,
    TaskDetail,
    TaskFilter,
    TaskRow,
    finished_after,
    list_finished,
    list_tasks,
    state_counts,
    task_detail,
    task_names,
)
from .workers import ConsumerInfo, WorkerLoad, running_by_worker, stream_consumers

__all__ = [
    "COUNT_CAP",
    "PAGE_SIZE",
    "AgentRunDetail",
    "ConsumerInfo",
    "FinishedRow",
    "JournalRun",
    "Page",
    "TaskDetail",
    "TaskFilter",
    "TaskRow",
    "WorkerLoad",
    "agent_run",
    "agent_runs",
    "audit_entries",
    "decode_cursor",
    "encode_cursor",
    "finished_after",
    "journal_run",
    "list_finished",
    "list_tasks",
    "open_approvals",
    "running_by_worker",
    "state_counts",
    "stream_consumers",
    "task_detail",
    "task_names",
]
