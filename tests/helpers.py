"""Small typed helpers shared by tests."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

import anyio

from durable_tasks import App
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.transport.keys import QueueKeys
from durable_tasks.transport.messages import StreamEntry, parse_delivery


def keys(app: App, queue: str = "jobs") -> QueueKeys:
    """The Redis keys of ``queue`` in the app's namespace."""
    return QueueKeys(app.settings.namespace, queue)


async def entries(app: App, stream: str) -> list[tuple[str, dict[str, str]]]:
    """Every entry of ``stream`` as (id, fields)."""
    raw: Any = await app.runtime.transport().client.xrange(stream)
    return [(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for i, f in raw or []]


async def claim_entry(
    app: App, entry: StreamEntry, worker_id: str, *, lease: timedelta | None = None
) -> ExecutionClaim | None:
    """Take the execution fence for ``entry`` as worker ``worker_id`` would (None: refused)."""
    d = parse_delivery(entry.fields)
    [claim] = await app.runtime.store.claim_executions(
        app.settings.namespace,
        [ClaimRequest(d.task_id, d.generation, d.delivery)],
        worker_id=worker_id,
        now=app.clock(),
        lease=lease or app.settings.lease_timeout,
    )
    return claim if isinstance(claim, ExecutionClaim) else None


async def die_running_alone(app: App, entry: StreamEntry, worker_id: str = "doomed-worker") -> ExecutionClaim:
    """Claim ``entry`` and mark its attempt solo, as a worker does right before it runs a
    suspect, and then do nothing more (the worker "died"): once the lease runs out the reaper
    charges the loss to the task (with max_deliveries=1, it is dead-lettered)."""
    claim = await claim_entry(app, entry, worker_id)
    assert claim is not None
    await app.runtime.store.mark_solo(claim)
    return claim


async def run_until_quiet(app: App, timeout: float = 60) -> None:
    """Run a dispatcher and a worker until nothing is left to do, twice in a row: no pending
    outbox row, no task waiting in a stream, no unacknowledged entry.

    A loop of short ``work(timeout=...)`` calls is not a drain: a call that times out cancels
    the tasks still running and leaves their entries pending for a reaper, so on a loaded
    machine the loop could stop with work left. Here the worker runs until the queues are
    quiet and then stops the way a deployment does (in-flight tasks finish).
    """
    stop = anyio.Event()
    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(app.run, reaper=False, stop=stop))
            quiet = 0
            while quiet < 2:
                await anyio.sleep(0.1)
                stats = (await app.stats()).values()
                busy = any(s.outbox_backlog or s.pel_size or s.stream_lag or s.queue_delay_s for s in stats)
                quiet = 0 if busy else quiet + 1
            stop.set()
