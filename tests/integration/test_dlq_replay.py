"""Replaying dead letters against real servers: operators replaying at once, entries deep in a
long DLQ, entries that are not there."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from sqlmodel import Session

from durable_tasks import App, TaskState, dlq
from durable_tasks.transport.streams import RedisStreamsTransport
from tests.integration.test_operator_cli import dead_letter_one, invoke, run_until_failed

APP = "tests.apps.cli_app:app"
pytestmark = pytest.mark.anyio


@pytest.fixture
def env(cli_app_env: Callable[..., dict[str, str]], clean_redis: None) -> Iterator[dict[str, str]]:
    yield cli_app_env(DT_LEASE_TIMEOUT="0.5", DT_HEARTBEAT_INTERVAL="0.1", DT_MAX_DELIVERIES="1", DT_READ_BLOCK="0.1")
    sys.modules.pop("tests.apps.cli_app", None)


def the_app() -> App:
    from tests.apps.cli_app import app

    app.create_all()
    return app


async def dlq_ids(app: App) -> list[str]:
    transport = app.runtime.transport()
    entries: Any = await transport.client.xrange(transport.keys("cli").dlq)
    await app.aclose()
    return [str(entry_id) for entry_id, _ in entries]


class Rendezvous:
    """Where concurrent replays meet: each waits until every replay still running is there."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived, self.changed = parties, 0, anyio.Event()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def meet(self) -> None:
        self.arrived += 1
        self._changed()
        while self.arrived < self.parties:
            await self.changed.wait()

    def leave(self) -> None:
        self.parties -= 1
        self._changed()


def meet_after(monkeypatch: pytest.MonkeyPatch, owner: type, method: str) -> Rendezvous:
    """Make two replays meet after each call of ``owner.method`` (an async read)."""
    meeting, read = Rendezvous(2), getattr(owner, method)

    async def read_then_meet(*args: Any, **kwargs: Any) -> Any:
        found = await read(*args, **kwargs)
        await meeting.meet()
        return found

    monkeypatch.setattr(owner, method, read_then_meet)
    return meeting


def test_two_operators_replaying_one_dead_letter_at_once_rerun_it_once(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = the_app()
    task_id = anyio.run(dead_letter_one, app)

    async def both() -> list[dlq.Replay]:
        # Each operator has read the DLQ page, and what the database said of its task, before
        # either reruns it (the reads are met at, not delayed: no sleeping).
        meetings = [
            meet_after(monkeypatch, RedisStreamsTransport, "dead_letter_page"),
            meet_after(monkeypatch, type(app.runtime.store), "lease_views"),
        ]
        done: list[dlq.Replay] = []

        async def one() -> None:
            done.append(await dlq.replay(app, "cli"))
            for meeting in meetings:
                meeting.leave()

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        await app.aclose()
        return done

    done = anyio.run(both)
    assert app.get_task(task_id).generation == 1  # one new generation: the body runs once more
    assert sorted(len(d.rerun) for d in done) == [0, 1]
    loser = next(d for d in done if not d.rerun)
    assert (len(loser.rerun_since), loser.kept) == (1, [])  # it says the task was rerun since
    assert anyio.run(dlq_ids, app) == []  # and its stale entry is gone


async def older_letters(app: App, n: int) -> None:
    """``n`` entries naming no task (a replay leaves them) ahead of what comes next."""
    transport = app.runtime.transport()
    async with transport.client.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.xadd(transport.keys("cli").dlq, {"dt_reason": f"malformed {i}"})
        await pipe.execute()
    await app.aclose()


def test_an_entry_behind_10000_others_is_replayed_by_id_and_by_replay_all(env: dict[str, str]) -> None:
    app = the_app()
    anyio.run(older_letters, app, 10_000)
    by_id = anyio.run(dead_letter_one, app)
    entry = anyio.run(dlq_ids, app)[-1]
    code, out = invoke("dlq", "replay", APP, "cli", "--entry", entry)
    assert code == 0, out
    assert f"replayed 1 task(s): {by_id}" in out
    assert app.get_task(by_id).state is TaskState.PENDING

    by_all = anyio.run(dead_letter_one, app)
    code, out = invoke("dlq", "replay", APP, "cli")  # every page, not the oldest 10,000
    assert code == 0, out
    assert f"replayed 1 task(s): {by_all}" in out
    assert "10000 entr(y/ies) left in the DLQ" in out
    assert app.get_task(by_all).state is TaskState.PENDING
    assert len(anyio.run(dlq_ids, app)) == 10_000


def test_a_replay_of_entries_not_in_the_dlq_names_them_and_exits_1(env: dict[str, str]) -> None:
    app = the_app()
    task_id = anyio.run(dead_letter_one, app)
    [entry] = anyio.run(dlq_ids, app)
    code, out = invoke("dlq", "replay", APP, "cli", "--entry", "1-0", "--entry", "nonsense")
    assert code == 1, out
    assert "replayed 0 task(s)" in out
    assert "not in the DLQ of cli: 1-0, nonsense" in out
    assert app.get_task(task_id).state is TaskState.DEAD

    code, out = invoke("dlq", "replay", APP, "cli", "--entry", entry, "--entry", "1-0")
    assert code == 0, out  # something asked for was replayed; the missing one is still named
    assert f"replayed 1 task(s): {task_id}" in out
    assert "not in the DLQ of cli: 1-0" in out
    code, out = invoke("dlq", "replay", APP, "cli", "--entry", entry)  # replayed already: gone
    assert code == 1, out
    assert f"not in the DLQ of cli: {entry}" in out
    assert app.get_task(task_id).generation == 1


def test_a_rerun_of_a_listed_failure_changed_since_writes_nothing(env: dict[str, str]) -> None:
    app = the_app()
    task_id = run_until_failed(app)
    failed = ("FAILED", "DEAD")
    with Session(app.engine) as session:
        assert dlq.rerun_as_listed(app, session, task_id, generation=0, states=failed) == 1
        session.commit()
    with Session(app.engine) as session:  # another operator, acting on the same list
        assert dlq.rerun_as_listed(app, session, task_id, generation=0, states=failed) is None
        assert dlq.rerun_as_listed(app, session, task_id, states=failed) is None  # PENDING now
        session.commit()
    assert (app.get_task(task_id).generation, app.get_task(task_id).state) == (1, TaskState.PENDING)
