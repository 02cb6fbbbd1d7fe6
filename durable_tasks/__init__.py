"""durable_tasks: background work that survives crashes.

A task intent is written in the caller's SQL transaction (transactional outbox), delivered
through Redis Streams, executed at least once, and its final result written under a fence so
no stale or duplicate execution changes it. See docs/guarantees.md.
"""

from .app import App
from .clock import Clock, FrozenClock
from .errors import (
    BrokerUnavailableError,
    ChildTaskFailedError,
    ConfigurationError,
    DatabaseUnavailableError,
    DurableTasksError,
    EmbeddedServerError,
    IdempotencyConflictError,
    InvalidDelayError,
    InvalidFlowControlError,
    InvalidIdempotencyKeyError,
    InvalidSessionError,
    JournalFencedOutError,
    MigrationError,
    PayloadError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    ResultNotSerializableError,
    ResultTimeoutError,
    SchemaError,
    SchemaMissingError,
    SchemaOutdatedError,
    SchemaTooNewError,
    SignalError,
    TaskCancelledError,
    TaskDeadLetteredError,
    TaskFailedError,
    TaskNotFoundError,
    TaskOutcomeError,
    UnknownScheduleError,
    UnknownTaskError,
)
from .flow.control import LimitInfo
from .flow.policy import Limit
from .journal import Journal, current_journal
from .periodic import CatchUp
from .reaper import ReapReport
from .records import AttemptOutcome, TaskState
from .scheduler import ScheduleInfo
from .settings import Settings, SettingsOverrides
from .store.retention import PruneReport
from .tasks import SubmitManyOptions, SubmitOptions, Task, TaskContext, TaskHandle, current_task
from .views import AttemptInfo, PendingApproval, QueueStats, StepInfo, TaskInfo

__all__ = [
    "App",
    "AttemptInfo",
    "AttemptOutcome",
    "BrokerUnavailableError",
    "CatchUp",
    "ChildTaskFailedError",
    "Clock",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DurableTasksError",
    "EmbeddedServerError",
    "FrozenClock",
    "IdempotencyConflictError",
    "InvalidDelayError",
    "InvalidFlowControlError",
    "InvalidIdempotencyKeyError",
    "InvalidSessionError",
    "Journal",
    "JournalFencedOutError",
    "Limit",
    "LimitInfo",
    "MigrationError",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PayloadValidationError",
    "PendingApproval",
    "PruneReport",
    "QueueStats",
    "ReapReport",
    "ResultNotSerializableError",
    "ResultTimeoutError",
    "ScheduleInfo",
    "SchemaError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "Settings",
    "SettingsOverrides",
    "SignalError",
    "StepInfo",
    "SubmitManyOptions",
    "SubmitOptions",
    "Task",
    "TaskCancelledError",
    "TaskContext",
    "TaskDeadLetteredError",
    "TaskFailedError",
    "TaskHandle",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskOutcomeError",
    "TaskState",
    "UnknownScheduleError",
    "UnknownTaskError",
    "current_journal",
    "current_task",
]
