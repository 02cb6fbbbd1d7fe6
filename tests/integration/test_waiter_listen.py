"""A dispatcher (or the dashboard's live overview) listens before its first read of the outbox:
a submit committed after ``listen()`` and before the first ``wait()`` ends that wait at once,
on every backend (PostgreSQL's NOTIFY, Redis wake-ups on SQLite and MySQL). Before, the
LISTEN/SUBSCRIBE happened inside the first wait, and such a submit waited for the poll."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
from sqlmodel import Session

from durable_tasks import App
from tests import helpers

pytestmark = pytest.mark.anyio

#: Only a wake-up can end a wait this long within the test's deadline.
POLL = timedelta(hours=1)


async def test_a_submit_between_listen_and_the_first_wait_ends_the_wait(make_app: Callable[..., App]) -> None:
    app = helpers.doubling_app(make_app, poll_interval=POLL)
    waiter = app.runtime.outbox_waiter()
    try:
        await waiter.listen()
        with Session(app.engine) as session:
            app.submit(session, "double", 21)
            session.commit()
        with anyio.fail_after(30):  # far below the hour-long poll
            await waiter.wait(POLL)
    finally:
        await waiter.aclose()
        await app.aclose()
