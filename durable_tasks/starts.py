"""Recording when held attempts start.

A worker claims an attempt *held* (``dt_tasks.started_at`` left NULL:
:attr:`~durable_tasks.store.execution.ExecutionClaim.held`) when the attempt must wait at its
isolation gate first: every suspect's, and every attempt claimed while the worker isolates. A
worker killed while such an attempt waits ran none of its code, so the reaper does not make
the task more suspect for that loss (:func:`~durable_tasks.policy.loss_suspects`). The start
is recorded just before the attempt's code runs; the attempts the gate lets in together (a
group of suspects, or the shared attempts a finished group lets go) share one statement.
"""

from __future__ import annotations

from collections.abc import Sequence

from .batching import Coalescer
from .runtime import Runtime
from .store.execution import ExecutionClaim

__all__ = ["StartRecorder"]


class StartRecorder:
    """Records the starts of held attempts, many in one statement."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._coalescer: Coalescer[ExecutionClaim] = Coalescer(self._record, max_batch=1000)

    async def run(self) -> None:
        """Record batches until cancelled (run it in the worker's task group)."""
        await self._coalescer.run()

    async def started(self, claim: ExecutionClaim) -> None:
        """Return once the start of ``claim`` (a held one) is recorded. Raises the database's
        error when it cannot be: the attempt must not run then (its entry stays pending for
        the reaper)."""
        await self._coalescer.submit(claim)

    async def _record(self, claims: Sequence[ExecutionClaim]) -> None:
        await self.runtime.store.mark_started(claims, now=self.runtime.clock())
