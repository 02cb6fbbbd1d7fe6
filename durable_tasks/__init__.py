"""durable_tasks: background work that survives crashes.

A task intent is written in the caller's SQL transaction (transactional outbox), delivered
through Redis Streams, executed at least once, and its final result written under a fence so
no stale or duplicate execution changes it. See docs/guarantees.md.
"""

from .app import App
from .clock import Clock, FrozenClock
from .errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DatabaseUnavailableError,
    DurableTasksError,
    InvalidIdempotencyKeyError,
    PayloadError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    ResultNotSerializableError,
    TaskDeadLetteredError,
    TaskNotFoundError,
    UnknownTaskError,
)
from .reaper import ReapReport
from .records import AttemptOutcome, OutboxState, TaskState
from .settings import Settings
from .tasks import Task, TaskContext, TaskHandle
from .views import AttemptInfo, QueueStats, TaskInfo

__all__ = [
    "App",
    "AttemptInfo",
    "AttemptOutcome",
    "BrokerUnavailableError",
    "Clock",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DurableTasksError",
    "FrozenClock",
    "InvalidIdempotencyKeyError",
    "OutboxState",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PayloadValidationError",
    "QueueStats",
    "ReapReport",
    "ResultNotSerializableError",
    "Settings",
    "Task",
    "TaskContext",
    "TaskDeadLetteredError",
    "TaskHandle",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskState",
    "UnknownTaskError",
]
