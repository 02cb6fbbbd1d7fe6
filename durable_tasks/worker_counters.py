"""What a worker counts of its attempts' outcomes."""

from __future__ import annotations

from .attempt import ExecutionOutcome

__all__ = ["WorkerCounters"]


class WorkerCounters:
    """What one worker did; tests and stats read it."""

    def __init__(self) -> None:
        self.settled = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.skipped_stale = 0
        self.fenced_out = 0
        self.suspended = 0
        self.malformed = 0
        self.unsettled = 0

    def count(self, outcome: ExecutionOutcome) -> None:
        """Count an attempt's outcome."""
        match outcome:
            case ExecutionOutcome.SUCCEEDED:
                self.succeeded += 1
            case ExecutionOutcome.RETRYING:
                self.retried += 1
            case ExecutionOutcome.FAILED:
                self.failed += 1
            case ExecutionOutcome.FENCED_OUT:
                self.fenced_out += 1
            case ExecutionOutcome.SUSPENDED:
                self.suspended += 1
