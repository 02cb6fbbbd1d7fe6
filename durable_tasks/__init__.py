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
    EmbeddedServerError,
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
from .records import AttemptOutcome, TaskState
from .settings import Settings, SettingsOverrides
from .store.retention import PruneReport
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
    "EmbeddedServerError",
    "FrozenClock",
    "InvalidIdempotencyKeyError",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PayloadValidationError",
    "PruneReport",
    "QueueStats",
    "ReapReport",
    "ResultNotSerializableError",
    "Settings",
    "SettingsOverrides",
    "Task",
    "TaskContext",
    "TaskDeadLetteredError",
    "TaskHandle",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskState",
    "UnknownTaskError",
]
