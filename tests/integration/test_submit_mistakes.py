"""Submitting wrong gives a typed error that says what to pass, and writes nothing: an Engine
or Connection instead of a Session; an idempotency key already used with a different payload."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlmodel import Session

from durable_tasks import App, IdempotencyConflictError, InvalidSessionError, TaskContext
from durable_tasks.records import tasks_table
from durable_tasks.store.engine import read_only

pytestmark = pytest.mark.anyio


class Order(BaseModel):
    order_id: int
    amount: int


def tasks_written(app: App) -> int:
    with read_only(app.engine).connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(tasks_table.c.namespace == app.settings.namespace)
            ).scalar_one()
        )


@pytest.fixture
def shop(app: App) -> App:
    @app.task(name="charge", queue="jobs")
    def charge(ctx: TaskContext[Order], p: Order) -> int:
        return p.amount

    return app


async def test_an_engine_or_a_connection_instead_of_a_session_is_a_typed_error(shop: App) -> None:
    order = Order(order_id=1, amount=5)
    with pytest.raises(InvalidSessionError, match=r"not an Engine: with Session\(engine\) as session"):
        shop.submit(shop.engine, "charge", order)  # type: ignore[arg-type]
    with shop.engine.connect() as conn:
        with pytest.raises(InvalidSessionError, match=r"not a Connection: .*Session\(bind=connection\)"):
            shop.submit(conn, "charge", order)  # type: ignore[arg-type]
        with pytest.raises(InvalidSessionError, match=r"app\.rerun takes"):
            shop.rerun(conn, "some-task-id")  # type: ignore[arg-type]
    assert tasks_written(shop) == 0


async def test_an_async_session_points_to_asubmit(shop: App) -> None:
    if shop.engine.dialect.name != "sqlite":
        pytest.skip("the check runs before any database work; one backend shows it")
    engine = create_async_engine("sqlite+aiosqlite://")
    async with AsyncSession(engine) as session:
        with pytest.raises(InvalidSessionError, match=r"use app\.asubmit"):
            shop.submit(session, "charge", Order(order_id=1, amount=5))  # type: ignore[arg-type]
    await engine.dispose()


async def test_the_same_key_and_payload_return_the_task_a_different_payload_is_a_conflict(shop: App) -> None:
    with Session(shop.engine) as session:
        first = shop.submit(session, "charge", Order(order_id=7, amount=5), idempotency_key="order-7")
        session.commit()
    with Session(shop.engine) as session:
        again = shop.submit(session, "charge", {"amount": 5, "order_id": 7}, idempotency_key="order-7")
        session.commit()
    assert (again.id, again.created) == (first.id, False)  # same JSON value, keys in another order
    conflict = "'order-7' was already used for task 'charge'"
    with Session(shop.engine) as session, pytest.raises(IdempotencyConflictError, match=conflict) as caught:
        shop.submit(session, "charge", Order(order_id=7, amount=6), idempotency_key="order-7")
    assert (caught.value.task_id, caught.value.idempotency_key) == (first.id, "order-7")
    assert shop.get_task(first.id).payload == {"order_id": 7, "amount": 5}
    assert tasks_written(shop) == 1


async def test_a_conflict_in_a_batch_writes_nothing_of_the_batch(shop: App) -> None:
    with Session(shop.engine) as session:
        shop.submit(session, "charge", Order(order_id=2, amount=1), idempotency_key="order-2")
        session.commit()
    with Session(shop.engine) as session:
        with pytest.raises(IdempotencyConflictError, match="'order-2'"):
            shop.submit_many(
                session,
                "charge",
                [(Order(order_id=1, amount=1), "order-1"), (Order(order_id=2, amount=9), "order-2")],
            )
        session.commit()  # what the caller's transaction holds: nothing of the batch
    assert tasks_written(shop) == 1
    with Session(shop.engine) as session:
        with pytest.raises(IdempotencyConflictError, match="'order-3'"):
            shop.submit_many(
                session,
                "charge",
                [(Order(order_id=3, amount=1), "order-3"), (Order(order_id=3, amount=2), "order-3")],
            )
        session.commit()
    assert tasks_written(shop) == 1


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"refund": 1}, {"refund": True}),  # Python's == takes them for one value; JSON does not
        ({"refund": 0}, {"refund": False}),
        ([1, {"ok": True}], [1, {"ok": 1}]),
    ],
)
async def test_true_and_1_under_one_key_are_a_conflict(app: App, first: Any, again: Any) -> None:
    @app.task(name="flag", queue="jobs")
    def flag(ctx: TaskContext[Any], p: Any) -> None:
        return None

    with Session(app.engine) as session:
        handle = app.submit(session, "flag", first, idempotency_key="req-1")
        session.commit()
    with Session(app.engine) as session, pytest.raises(IdempotencyConflictError, match="'req-1'"):
        app.submit(session, "flag", again, idempotency_key="req-1")
    with Session(app.engine) as session:  # the same payload again: the same task back
        same = app.submit(session, "flag", first, idempotency_key="req-1")
    assert (same.id, same.created) == (handle.id, False)
    assert app.get_task(handle.id).payload == first
