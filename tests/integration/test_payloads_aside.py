"""Large payloads kept apart from their task rows (store/payloads.py): on SQLite and
MySQL/MariaDB a payload over ASIDE_PAYLOAD_BYTES is written to dt_payloads once schema step 17
is applied, and its task row keeps ''; every reader finds it there (a claim, a read alone, the
task's view, the idempotency comparison), and it goes with its task. PostgreSQL keeps every
payload in dt_tasks."""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, IdempotencyConflictError, TaskContext, TaskState
from durable_tasks.migrations import migrate
from durable_tasks.migrations.runner import VERSION_TABLE
from durable_tasks.records import payloads_table, tasks_table
from durable_tasks.store import payloads
from durable_tasks.store.base import SqlStore
from durable_tasks.store.payloads import ASIDE_PAYLOAD_BYTES, INLINE_PAYLOAD_BYTES, AsideGate
from tests.helpers import FAST, run_until

pytestmark = pytest.mark.anyio

t = tasks_table.c
p = payloads_table.c


def text_of(size: int, seed: int) -> str:
    """``size`` characters that do not compress (random bytes in base64)."""
    return base64.b64encode(random.Random(seed).randbytes(size))[:size].decode()


def where_kept(app: App, task_id: str) -> tuple[str, str | None, int | None]:
    """(the task row's payload, the dt_payloads row's or None, payload_bytes)."""
    with app.engine.connect() as conn:
        row = conn.execute(sa.select(t.payload, t.payload_bytes).where(t.id == task_id)).one()
        aside = conn.execute(sa.select(p.payload).where(p.task_id == task_id)).scalar()
    return row.payload, aside, row.payload_bytes


def keeps_aside(app: App) -> bool:
    return app.engine.dialect.name != "postgresql"


def kept_apart(app: App, task_ids: list[str]) -> int:
    """How many of the tasks ``task_ids`` have a row in dt_payloads."""
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(p.task_id.in_(task_ids))).scalar_one())


async def test_a_large_payload_is_written_apart_once_and_every_reader_finds_it(make_app: Callable[..., App]) -> None:
    app = make_app()
    seen: dict[str, int] = {}

    @app.task(name="measure", queue="aside")
    def measure(ctx: TaskContext[str], text: str) -> int:
        seen[ctx.task_id] = len(text)
        return len(text)

    # at the line, just over it (the claim's lookup), and over what a claim carries (read alone)
    bodies = [text_of(n, seed=n) for n in (ASIDE_PAYLOAD_BYTES - 2, ASIDE_PAYLOAD_BYTES, 20_000, INLINE_PAYLOAD_BYTES)]
    with Session(app.engine) as session:
        one = [app.submit(session, "measure", body).id for body in bodies]
        many = [h.id for h in app.submit_many(session, "measure", [(body, None) for body in bodies])]
        session.commit()
    for ids in (one, many):
        for task_id, body in zip(ids, bodies, strict=True):
            row, aside, size = where_kept(app, task_id)
            assert size == len(body) + 2  # its JSON string's quotes
            if keeps_aside(app) and size > ASIDE_PAYLOAD_BYTES:
                assert (row, aside) == ("", f'"{body}"')
            else:
                assert (row, aside) == (f'"{body}"', None)
        assert [app.get_task(task_id).payload for task_id in ids] == bodies

    await run_until(app, lambda: len(seen) == 8, reaper=False)
    assert [seen[task_id] for task_id in one + many] == [len(b) for b in bodies] * 2
    assert all(app.get_task(task_id).state is TaskState.SUCCEEDED for task_id in one + many)


async def test_a_repeated_key_compares_the_payload_kept_apart(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="judge", queue="aside")
    def judge(ctx: TaskContext[str], code: str) -> int:
        return len(code)

    code, other = text_of(10_000, seed=1), text_of(10_000, seed=2)
    with Session(app.engine) as session:
        first = app.submit(session, "judge", code, idempotency_key="submission-1")
        session.commit()
    with Session(app.engine) as session:
        assert app.submit(session, "judge", code, idempotency_key="submission-1").id == first.id
        [again] = app.submit_many(session, "judge", [(code, "submission-1")])
        assert again.id == first.id
        with pytest.raises(IdempotencyConflictError):
            app.submit(session, "judge", other, idempotency_key="submission-1")
        with pytest.raises(IdempotencyConflictError):  # the batch's new task is undone, its payload too
            app.submit_many(session, "judge", [(text_of(10_000, seed=3), "submission-2"), (other, "submission-1")])
        orphans = sa.select(sa.func.count()).where(p.task_id.not_in(sa.select(t.id)))
        assert session.connection().execute(orphans).scalar_one() == 0
    assert kept_apart(app, [first.id]) == int(keeps_aside(app))


async def test_a_pruned_task_takes_its_payload_with_it(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="judge", queue="aside")
    def judge(ctx: TaskContext[str], code: str) -> int:
        return len(code)

    with Session(app.engine) as session:
        ids = [app.submit(session, "judge", text_of(10_000, seed=i)).id for i in range(3)]
        session.commit()
    await run_until(app, lambda: all(app.get_task(i).state is TaskState.SUCCEEDED for i in ids), reaper=False)
    assert kept_apart(app, ids) == 3 * keeps_aside(app)
    assert app.prune(timedelta(0), paced=False).tasks == 3
    assert kept_apart(app, ids) == 0


async def test_before_the_post_deploy_step_every_payload_stays_in_its_task_row(
    new_database: Callable[[], str], redis_url: str, namespace: str, tmp_path: Path, clean_redis: None
) -> None:
    """Code older than step 16 reads dt_tasks.payload alone: until step 17 records that no such
    code runs, payloads stay there; a process that started before it begins within the gate's
    recheck once it is applied."""
    app = App(new_database(), redis_url, namespace, data_dir=tmp_path / "data", **FAST)
    try:

        @app.task(name="judge", queue="aside")
        def judge(ctx: TaskContext[str], code: str) -> int:
            return len(code)

        migrate(app.engine, to=16)
        clock = [0.0]
        store = app.runtime.store
        assert isinstance(store, SqlStore)
        if store.aside_gate is not None:  # PostgreSQL's store has none: it never writes aside
            store.aside_gate = AsideGate(app.engine, clock=lambda: clock[0])
        code = text_of(10_000, seed=3)

        def submit() -> str:
            with Session(app.engine) as session:
                task_id = app.submit(session, "judge", code).id
                session.commit()
            return task_id

        before = submit()
        assert where_kept(app, before)[:2] == (f'"{code}"', None)
        migrate(app.engine)
        clock[0] += AsideGate.RECHECK - 1
        assert where_kept(app, submit())[:2] == (f'"{code}"', None)  # not read again yet
        clock[0] += 1
        after = submit()
        assert where_kept(app, after)[:2] == (("", f'"{code}"') if keeps_aside(app) else (f'"{code}"', None))
        assert [app.get_task(i).payload for i in (before, after)] == [code, code]
    finally:
        app.runtime.store.close()


def test_the_gate_reads_the_migrations_version_table() -> None:
    """AsideGate names the table in SQL (the store cannot import the migrations: they import it)."""
    assert payloads._VERSIONS == VERSION_TABLE
