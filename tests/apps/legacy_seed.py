"""Run under the durable_tasks of an older commit (PYTHONPATH points at its source): create the
schema the way that code did (``App.create_all()``) and leave tasks in every state there.

Arguments: database URL, Redis URL, namespace, data dir. Prints one JSON object: the module
path of the durable_tasks that ran, and the task ids by the state they were left in.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import anyio
from pydantic import BaseModel
from sqlmodel import Session

import durable_tasks
from durable_tasks import App, TaskContext
from durable_tasks.transport.messages import parse_delivery


class Add(BaseModel):
    a: int
    b: int


def main() -> None:
    database_url, redis_url, namespace, data_dir = sys.argv[1:5]
    app = App(
        database_url,
        redis_url,
        namespace,
        data_dir=data_dir,
        lease_timeout=timedelta(seconds=1),
        heartbeat_interval=timedelta(milliseconds=300),
    )

    @app.task(name="upgrade.add", queue="upgrade")
    def add(ctx: TaskContext[Add], p: Add) -> int:
        return p.a + p.b

    app.create_all()
    anyio.run(seed, app)


async def seed(app: App) -> None:
    with Session(app.engine) as s:
        early = [app.submit(s, "upgrade.add", {"a": i, "b": 1}, idempotency_key=f"early-{i}").id for i in range(4)]
        s.commit()
    await app.dispatch_once()  # all four ENQUEUED
    # One RUNNING: a worker reads and claims it, then dies (its lease runs out).
    transport = app.transport() if hasattr(app, "transport") else app.runtime.transport()
    [entry] = await transport.read(["upgrade"], "doomed", count=1, block=timedelta(seconds=1))
    await claim_and_die(app, parse_delivery(entry.fields))
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=20)) == 1  # one SUCCEEDED
    with Session(app.engine) as s:  # two PENDING: never dispatched
        late = [app.submit(s, "upgrade.add", {"a": 10 + i, "b": 1}).id for i in range(2)]
        s.commit()
    await app.aclose()
    states = {task_id: app.get_task(task_id).state.value for task_id in early + late}
    print(json.dumps({"module": durable_tasks.__file__, "states": states}))


async def claim_and_die(app: App, d: Any) -> None:
    """Claim the delivery as a worker that dies next: through the store functions of code
    before the Store protocol, through the protocol after."""
    try:
        from durable_tasks.store.execution import claim_execution  # type: ignore[attr-defined]
    except ImportError:
        from durable_tasks.store.execution import ClaimRequest

        store: Any = app.runtime.store
        await store.claim_executions(
            app.settings.namespace,
            [ClaimRequest(d.task_id, d.generation, d.delivery)],
            worker_id="doomed",
            now=app.clock(),
            lease=timedelta(seconds=1),
        )
        return
    claim_execution(
        app.engine,
        app.settings.namespace,
        task_id=d.task_id,
        generation=d.generation,
        delivery=d.delivery,
        worker_id="doomed",
        now=app.clock(),
        lease=timedelta(seconds=1),
    )


if __name__ == "__main__":
    main()
