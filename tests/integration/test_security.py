"""Security: JSON only (a pickle in the stream runs nothing), signed entries, ACL users,
secrets kept out of logs and the DLQ listing."""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from durable_tasks import App, FrozenClock, TaskContext, TaskState
from durable_tasks.dlq import list_dead_letters
from durable_tasks.transport.messages import OutgoingMessage, entry_mac
from tests.helpers import die_running_alone, keys, outlive_lease, submit, submit_all
from tests.servers import private_redis

pytestmark = pytest.mark.anyio
CANARY = "canary-5ecret-d0-not-leak"


class Exploit:
    """Unpickling this would create a marker file: it must never happen."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def register(app: App, ran: list[int]) -> None:
    @app.task(name="guarded", queue="jobs")
    def guarded(ctx: TaskContext[int], n: int) -> int:
        ran.append(n)
        return n


async def test_a_pickle_in_the_stream_is_dead_lettered_unexecuted(app: App, tmp_path: Path) -> None:
    ran: list[int] = []
    register(app, ran)
    marker = tmp_path / "pwned"
    client = app.runtime.transport().client
    await client.xadd(keys(app).stream, {"t": pickle.dumps(Exploit(marker)), "g": "0", "d": "0", "n": "guarded"})
    await client.xadd(keys(app).stream, {"payload": pickle.dumps(Exploit(marker))})
    assert await app.work(max_tasks=2, timeout=timedelta(seconds=10)) == 2
    assert not marker.exists()
    assert ran == []
    assert len(await list_dead_letters(app, "jobs")) == 2


async def test_signed_entries_run_and_forged_ones_do_not(make_app: Callable[..., App]) -> None:
    # Only the dispatcher publishes: the forgeries below name a task whose entry is not out yet.
    app = make_app(signing_key="k1-" + "x" * 29, publish_on_commit=False)
    ran: list[int] = []
    register(app, ran)
    good = submit(app, "guarded", 1)
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(good).state == TaskState.SUCCEEDED

    victim = submit(app, "guarded", 2)  # a real task, not yet dispatched: forgeries name it
    stream = keys(app).stream
    fields = OutgoingMessage("jobs", victim, 0, 0, "guarded").fields()
    client = app.runtime.transport().client
    await client.xadd(stream, fields)  # unsigned
    await client.xadd(stream, {**fields, "s": entry_mac(b"another key", stream, fields)})  # wrong key
    await client.xadd(stream, {**fields, "s": entry_mac(b"k1-" + b"x" * 29, keys(app, "other").stream, fields)})
    tampered = OutgoingMessage("jobs", good, 0, 0, "guarded").fields(stream, b"k1-" + b"x" * 29)
    await client.xadd(stream, {**tampered, "t": victim})  # signature of another task
    assert await app.work(max_tasks=4, timeout=timedelta(seconds=10)) == 4
    assert ran == [1]
    reasons = [d.reason for d in await list_dead_letters(app, "jobs")]
    assert len(reasons) == 4
    assert all("refused unexecuted" in r for r in reasons)
    assert app.get_task(victim).state == TaskState.PENDING  # the real delivery still goes out
    await app.dispatch_once()
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert ran == [1, 2]
    await app.aclose()


ACL_COMMANDS = (
    "+ping +client|setinfo +hello +info +time +config|get +evalsha +script|load +get +set +exists "
    "+xadd +xreadgroup +xgroup|create +xack +xautoclaim +xpending +xinfo|groups +xlen +xrange +xtrim +xdel +del"
)


async def test_a_least_privilege_acl_user_runs_the_whole_path(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(f"user default off\nuser dt on >s3cret ~dt:* -@all {ACL_COMMANDS}\n")
    with private_redis(tmp_path / "acl", "--aclfile", str(aclfile)) as server:
        url = f"redis://dt:s3cret@127.0.0.1:{server.port}/0"
        app = App(
            database_url,
            url,
            namespace,
            lease_timeout=timedelta(seconds=1),
            heartbeat_interval=timedelta(milliseconds=300),
            reconcile_grace=timedelta(0),
        )
        app.create_all()
        ran: list[int] = []
        register(app, ran)
        task_id = submit(app, "guarded", 1)
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
        await app.reap_once()
        await app.stats()
        assert app.get_task(task_id).state == TaskState.SUCCEEDED
        with pytest.raises(Exception, match=r"NOPERM|no permissions"):
            await app.runtime.transport().client.flushall()  # and nothing beyond what it needs
        await app.aclose()


async def test_a_secret_in_a_payload_stays_out_of_logs_and_the_dlq(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = make_app(max_deliveries=1, clock=FrozenClock())

    @app.task(name="secretive", queue="jobs", max_attempts=2)
    def secretive(ctx: TaskContext[dict[str, str]], p: dict[str, str]) -> str:
        raise RuntimeError("downstream refused the request")

    failing, lost = (h.id for h in submit_all(app, "secretive", [{"api_token": CANARY}] * 2))
    await app.dispatch_once()
    entries = await app.runtime.transport().read(["jobs"], "dies", count=1, block=timedelta(milliseconds=100))
    lost_task = entries[0].fields["t"]
    await die_running_alone(app, entries[0], "dies")
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    assert await outlive_lease(app) == 1
    await app.reap_once()
    assert {app.get_task(failing).state, app.get_task(lost).state} == {TaskState.FAILED, TaskState.DEAD}
    assert app.get_task(lost_task).state == TaskState.DEAD
    dlq = await list_dead_letters(app, "jobs")
    assert dlq
    assert CANARY not in repr(dlq)
    assert CANARY not in caplog.text
    assert os.environ.get("DT_CANARY") is None
