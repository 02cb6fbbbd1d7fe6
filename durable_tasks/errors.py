"""Errors raised by durable_tasks.

Every error the library raises on purpose derives from one root, so callers can catch
``DurableTasksError`` and still tell the cases apart::

    DurableTasksError
    ├── ConfigurationError            bad settings, namespace or queue name
    ├── UnknownTaskError              no task registered under that name
    ├── PayloadError                  a payload cannot become a durable intent
    │   ├── PayloadValidationError    fails the task's payload model
    │   ├── PayloadNotSerializableError  not plain JSON (NaN, bytes, objects, too deep)
    │   └── PayloadTooLargeError      over ``max_payload_bytes``
    ├── ResultNotSerializableError    a handler returned something that is not plain JSON
    ├── InvalidIdempotencyKeyError    empty, too long, or with control characters or a lone surrogate
    ├── IdempotencyConflictError      a key already used for the same task with a different payload
    ├── InvalidSessionError           submit given an Engine, a Connection or an AsyncSession, not a Session
    ├── InvalidDelayError             a negative delay, both delay and not_before, a naive datetime
    ├── InvalidFlowControlError       a priority out of range, a bad concurrency or partition key, a bad rate
    ├── TaskNotFoundError             no task with that id in this namespace
    ├── InvalidQueryError             a search or page cursor an operator's view cannot run
    ├── TaskDeadLetteredError         given to on_failure hooks when the reaper gives up on a task
    ├── TaskOutcomeError              a waited-for task ended without a result (.state, .error_type)
    │   ├── TaskFailedError           FAILED (no attempts left) or DEAD (dead-lettered)
    │   └── TaskCancelledError        CANCELLED
    ├── ResultTimeoutError            a result wait's timeout passed first (also a TimeoutError)
    ├── UnknownScheduleError          no periodic schedule registered under that name
    ├── ChildTaskFailedError          a child task a handler waited on ended FAILED, DEAD or CANCELLED
    ├── JournalFencedOutError         a journal write of an attempt that no longer owns its task
    ├── SignalError                   a bad signal name, or a payload that is not plain JSON or too large
    ├── DatabaseUnavailableError      the database cannot be reached (or refused a statement)
    ├── BrokerUnavailableError        Redis / Valkey cannot be reached
    │   └── EmbeddedServerError       the embedded Valkey did not start
    └── SchemaError                   the database's durable_tasks schema does not fit this code
        ├── SchemaMissingError        no durable_tasks tables: run `durable-tasks init-db`
        ├── SchemaOutdatedError       older than this code needs: run `durable-tasks migrate`
        ├── SchemaTooNewError         changed by a newer release in a way this code cannot run on
        └── MigrationError            a migration cannot be applied as the database stands

Each message says what to do next. Nothing is written when one of these is raised at submit.
"""

from __future__ import annotations

__all__ = [
    "BrokerUnavailableError",
    "ChildTaskFailedError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DurableTasksError",
    "EmbeddedServerError",
    "IdempotencyConflictError",
    "InvalidDelayError",
    "InvalidFlowControlError",
    "InvalidIdempotencyKeyError",
    "InvalidQueryError",
    "InvalidSessionError",
    "JournalFencedOutError",
    "MigrationError",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PayloadValidationError",
    "ResultNotSerializableError",
    "ResultTimeoutError",
    "SchemaError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "SignalError",
    "TaskCancelledError",
    "TaskDeadLetteredError",
    "TaskFailedError",
    "TaskNotFoundError",
    "TaskOutcomeError",
    "UnknownScheduleError",
    "UnknownTaskError",
]


class DurableTasksError(Exception):
    """Root of every error durable_tasks raises on purpose."""


class ConfigurationError(DurableTasksError):
    """A setting, namespace or queue name is unusable."""


class UnknownTaskError(DurableTasksError):
    """No task is registered under the given name."""


class PayloadError(DurableTasksError):
    """A payload cannot be recorded as a durable intent."""


class PayloadValidationError(PayloadError):
    """The payload does not match the task's payload type."""


class PayloadNotSerializableError(PayloadError):
    """The payload is not plain JSON (NaN, bytes, arbitrary objects, nesting too deep)."""


class PayloadTooLargeError(PayloadError):
    """The serialized payload is larger than ``max_payload_bytes``."""


class ResultNotSerializableError(DurableTasksError):
    """A handler (or a journal step) returned a value that cannot be stored: not plain JSON, or
    over ``max_payload_bytes``."""


class InvalidIdempotencyKeyError(DurableTasksError):
    """An idempotency key is empty, too long, or contains control characters or a lone surrogate."""


class IdempotencyConflictError(DurableTasksError):
    """The idempotency key was already used for this task with a different payload.

    A key names one request; the same key with another payload is a caller's bug (two requests
    sharing an id), and returning the first task would silently drop the second payload.
    ``task_id`` is the task that holds the key; ``idempotency_key`` the key.
    """

    def __init__(self, message: str, *, task_id: str, idempotency_key: str) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.idempotency_key = idempotency_key


class InvalidSessionError(DurableTasksError):
    """``submit`` (or ``rerun``/``cancel``) was given something other than the caller's ORM
    ``Session``: an Engine, a Connection, or an ``AsyncSession`` (which ``asubmit`` takes)."""


class InvalidDelayError(DurableTasksError):
    """A delay or ``not_before`` cannot say when a task is due (negative, both given, naive)."""


class InvalidFlowControlError(DurableTasksError):
    """A priority, concurrency key, partition key, rate or limit cannot be used (durable_tasks.flow)."""


class TaskNotFoundError(DurableTasksError):
    """No task with that id exists in this namespace."""


class TaskDeadLetteredError(DurableTasksError):
    """The reaper gave up on a task (its workers kept dying): what ``on_failure`` hooks receive."""


class TaskOutcomeError(DurableTasksError):
    """A waited-for task reached a final state other than SUCCEEDED: ``state`` says which,
    ``error_type`` and ``error_message`` what the database recorded."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str,
        generation: int,
        state: str,
        error_type: str | None = None,
        error_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.generation = generation
        self.state = state
        self.error_type = error_type
        self.error_message = error_message


class TaskFailedError(TaskOutcomeError):
    """The task ended FAILED (its attempts ran out, or its error does not retry) or DEAD (the
    reaper gave up on it, or its payload was invalid)."""


class TaskCancelledError(TaskOutcomeError):
    """The task was cancelled before it produced a result."""


class ResultTimeoutError(DurableTasksError, TimeoutError):
    """A result wait ended at its timeout; the task goes on (``state``: the last state seen)."""

    def __init__(self, message: str, *, task_id: str, state: str | None) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.state = state


class UnknownScheduleError(DurableTasksError):
    """No periodic schedule is registered under that name."""


class ChildTaskFailedError(DurableTasksError):
    """A child task the handler waited on did not succeed. Not retried: a replay of the
    journal returns the same outcome. ``state`` is FAILED, DEAD or CANCELLED."""

    def __init__(self, slot: str, state: str, error_type: str | None, error_message: str | None) -> None:
        self.slot = slot
        self.state = state
        self.error_type = error_type
        self.error_message = error_message
        detail = f"{error_type}: {error_message}" if error_type else (error_message or "no reason recorded")
        super().__init__(f"child {slot} ended {state} ({detail}); rerun the task to try again")


class JournalFencedOutError(DurableTasksError):
    """A journal write was refused: a newer attempt or generation owns the task now."""


class SignalError(DurableTasksError):
    """A signal cannot be delivered or waited for: a name that is not printable text of 1-200
    characters, or a payload that is not plain JSON or is over ``max_payload_bytes``. A signal
    to no task raises :class:`TaskNotFoundError`."""


class DatabaseUnavailableError(DurableTasksError):
    """The database cannot be reached, refused one of the runtime's statements (its tables
    are missing, for instance), or rolled back or stopped one (a deadlock, a lock or statement
    timeout); the message says which, and what to do."""


class BrokerUnavailableError(DurableTasksError):
    """Redis (or Valkey) cannot be reached."""


class InvalidQueryError(DurableTasksError):
    """A search filter or page cursor that the read model cannot run (unknown state, bad cursor)."""


class EmbeddedServerError(BrokerUnavailableError):
    """The embedded Valkey server (used when no Redis URL is given) could not be started or
    reached."""


class SchemaError(DurableTasksError):
    """The database's durable_tasks schema does not fit this code (see the subclasses)."""


class SchemaMissingError(SchemaError):
    """The database has no durable_tasks tables yet: ``durable-tasks init-db`` creates them."""


class SchemaOutdatedError(SchemaError):
    """The schema is older than this code needs: ``durable-tasks migrate`` brings it up."""


class SchemaTooNewError(SchemaError):
    """A newer release changed the schema in a way this code cannot run on: deploy that release."""


class MigrationError(SchemaError):
    """A migration cannot be applied as the database stands (it says what differs)."""
