"""Group commit: many fenced results in one transaction, each fenced on its own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.batching import Coalescer
from durable_tasks.records import tasks_table
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.store.results import CommitOutcome, FinalWrite
from tests.helpers import register_fan, statements_on

pytestmark = pytest.mark.anyio


async def claimed(app: App, n: int) -> list[ExecutionClaim]:
    @app.task(name="noop", queue="jobs")
    def noop(ctx: TaskContext[int], p: int) -> int:
        return p

    with Session(app.engine) as s:
        ids = [noop.submit(s, i).id for i in range(n)]
        s.commit()
    claims = await app.runtime.store.claim_executions(
        app.settings.namespace,
        [ClaimRequest(i, 0, 0) for i in ids],
        worker_id="w",
        now=app.clock(),
        lease=timedelta(seconds=30),
    )
    assert all(isinstance(c, ExecutionClaim) for c in claims)
    return [c for c in claims if isinstance(c, ExecutionClaim)]


def committer_for(app: App, *, max_batch: int, window: timedelta) -> Coalescer[FinalWrite]:
    async def flush(writes: Sequence[FinalWrite]) -> None:
        await app.runtime.store.commit_results(writes, now=app.clock())

    return Coalescer(flush, max_batch=max_batch, window=window)


async def commit_concurrently(committer: Coalescer[FinalWrite], writes: Sequence[FinalWrite]) -> None:
    """Run ``committer`` while every write is submitted to it at once; return when all settled."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(committer.run)
        async with anyio.create_task_group() as inner:
            for w in writes:
                inner.start_soon(committer.submit, w)
        tg.cancel_scope.cancel()


def failing_hook(conn: sa.Connection) -> None:
    raise RuntimeError("hook broke")


async def test_a_stale_row_and_a_failing_hook_affect_only_their_own_task(app: App) -> None:
    ok, stale, broken, stale_plain, ok_hooked = await claimed(app, 5)
    with Session(app.engine) as s:
        app.rerun(s, stale.task_id)  # a new generation: this execution is now stale
        app.rerun(s, stale_plain.task_id)
        s.commit()
    writes = [
        FinalWrite(ok, "1"),
        FinalWrite(stale, "2", hook=lambda conn: None),
        FinalWrite(broken, "3", hook=failing_hook),
        FinalWrite(stale_plain, "4"),
        FinalWrite(ok_hooked, "5", hook=lambda conn: None),
    ]
    await commit_concurrently(committer_for(app, max_batch=10, window=timedelta(0)), writes)
    assert [w.outcome for w in writes] == [
        CommitOutcome.COMMITTED,
        CommitOutcome.FENCED_OUT,
        CommitOutcome.HOOK_FAILED,
        CommitOutcome.FENCED_OUT,
        CommitOutcome.COMMITTED,
    ]
    assert app.get_task(ok.task_id).result == 1
    assert app.get_task(ok_hooked.task_id).result == 5
    assert app.get_task(ok.task_id).state == TaskState.SUCCEEDED
    assert app.get_task(stale.task_id).state == TaskState.PENDING  # its new generation waits
    broken_info = app.get_task(broken.task_id)
    assert (broken_info.state, broken_info.result) == (TaskState.RUNNING, None)


async def test_concurrent_results_share_transactions(app: App) -> None:
    claims = await claimed(app, 40)
    commits: list[int] = []
    sa.event.listen(app.engine, "commit", lambda conn: commits.append(1))
    writes = [FinalWrite(c, "0") for c in claims]
    await commit_concurrently(committer_for(app, max_batch=64, window=timedelta(milliseconds=20)), writes)
    assert all(w.outcome is CommitOutcome.COMMITTED for w in writes)
    assert len(commits) < len(writes) / 4  # 40 results, a handful of transactions


async def test_lease_renewal_extends_only_the_executions_still_held(app: App) -> None:
    held, superseded, finished = await claimed(app, 3)
    with Session(app.engine) as s:
        app.rerun(s, superseded.task_id)  # a new generation: this execution lost its fence
        s.commit()
    await app.runtime.store.commit_results([FinalWrite(finished, "0")], now=app.clock())
    later = app.clock() + timedelta(minutes=5)
    renewed = await app.runtime.store.renew_leases([held, superseded, finished], now=later, lease=timedelta(seconds=30))
    assert renewed == {held.task_id}
    with app.engine.connect() as conn:
        leases = dict(
            conn.execute(
                sa.select(tasks_table.c.id, tasks_table.c.lease_expires_at).where(
                    tasks_table.c.id.in_([held.task_id, superseded.task_id, finished.task_id])
                )
            ).all()
        )
    assert leases[held.task_id] is not None
    assert leases[held.task_id].replace(tzinfo=None) == (later + timedelta(seconds=30)).replace(tzinfo=None)
    assert leases[finished.task_id] is None  # a final write clears the lease; renewal left it so
    assert leases[superseded.task_id] is None or leases[superseded.task_id].replace(tzinfo=None) < later.replace(
        tzinfo=None
    )


async def test_childrens_results_settle_their_parent_and_only_hooked_ones_take_a_savepoint(app: App) -> None:
    """One group: a child without a hook (written with the group's other hook-less writes, no
    savepoint), a hooked child and a child whose hook raises. The first two settle their slots
    in the parent's journal in the same transaction; the third settles nothing, so the parent
    still waits for it."""

    fan = register_fan(app, 3)
    with Session(app.engine) as s:
        parent_id = fan.submit(s, 1).id
        s.commit()
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1  # runs, then suspends
    assert app.get_task(parent_id).state is TaskState.WAITING
    children = [step.child_task_id for step in app.steps(parent_id)]
    claims = await app.runtime.store.claim_executions(
        app.settings.namespace,
        [ClaimRequest(child_id, 0, 0) for child_id in children if child_id is not None],
        worker_id="w",
        now=app.clock(),
        lease=timedelta(seconds=30),
    )
    assert all(isinstance(c, ExecutionClaim) for c in claims)
    plain, hooked, broken = (c for c in claims if isinstance(c, ExecutionClaim))
    writes = [
        FinalWrite(plain, "2"),
        FinalWrite(hooked, "4", hook=lambda conn: None),
        FinalWrite(broken, "6", hook=failing_hook),
    ]
    with statements_on(app.engine, lambda st: st.lstrip().upper().startswith("SAVEPOINT")) as savepoints:
        await app.runtime.store.commit_results(writes, now=app.clock())
    assert [w.outcome for w in writes] == [CommitOutcome.COMMITTED, CommitOutcome.COMMITTED, CommitOutcome.HOOK_FAILED]
    assert len(savepoints) == 2  # the hooked two; the hook-less child is one of the group's plain writes
    settled = {step.child_task_id: step.done for step in app.steps(parent_id)}
    assert settled == {plain.task_id: True, hooked.task_id: True, broken.task_id: False}
    assert app.get_task(parent_id).state is TaskState.WAITING  # the broken child's slot is still open
    assert all(w.resumed is None for w in writes)
