"""A group commit's tail in one round trip: the XACKs of its entries and the announcement of its
outcomes (``RedisStreamsTransport.ack_and_announce``). A refused announcement never keeps an
entry pending; a refused XACK is raised, so the worker leaves the entry to the reaper."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from durable_tasks import App
from durable_tasks.transport.keys import CONSUMER_GROUP, QueueKeys, outcome_channel
from durable_tasks.transport.streams import RedisStreamsTransport
from tests.servers import private_redis

#: Redis alone is under test: one database is enough.
pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


async def delivered(transport: RedisStreamsTransport, stream: str) -> str:
    """Add an entry to ``stream`` and read it as consumer "w": its id, now pending."""
    await transport.ensure_group(stream)
    entry_id = str(await transport.client.xadd(stream, {"f": "v"}))
    await transport.client.xreadgroup(CONSUMER_GROUP, "w", {stream: ">"}, count=10)
    return entry_id


async def pending(transport: RedisStreamsTransport, stream: str) -> int:
    return int((await transport.client.xpending(stream, CONSUMER_GROUP))["pending"])


async def test_the_entries_of_two_streams_are_acknowledged_and_the_outcomes_announced(
    make_app: Callable[..., App],
) -> None:
    app = make_app()
    transport = app.runtime.transport()
    ns = app.settings.namespace
    streams = [QueueKeys(ns, "a").stream, QueueKeys(ns, "b").stream]  # keys the fixture deletes
    ids = [await delivered(transport, stream) for stream in streams]
    channel = outcome_channel(ns)
    pubsub = transport.client.pubsub()
    await pubsub.subscribe(channel)
    assert (await pubsub.get_message(timeout=1.0))["type"] == "subscribe"

    await transport.ack_and_announce({s: [i] for s, i in zip(streams, ids, strict=True)}, channel, "settled")

    assert [await pending(transport, s) for s in streams] == [0, 0]
    with anyio.fail_after(5):
        message = None
        while message is None:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
    assert message["data"] == "settled"
    await pubsub.aclose()
    await app.aclose()


async def test_an_xack_that_fails_is_raised(make_app: Callable[..., App]) -> None:
    app = make_app()
    transport = app.runtime.transport()
    ns = app.settings.namespace
    good = QueueKeys(ns, "good").stream
    entry_id = await delivered(transport, good)
    wrong = QueueKeys(ns, "wrong").stream
    await transport.client.set(wrong, "not a stream")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await transport.ack_and_announce({good: [entry_id], wrong: ["1-1"]}, outcome_channel(ns), "m")
    await app.aclose()


async def test_a_refused_announcement_still_acknowledges(
    make_app: Callable[..., App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A least-privilege user without PUBLISH (test_security's ACL): the XACK goes through, the
    # announcement is refused, logged and dropped (result waits fall back to reading).
    aclfile = tmp_path / "users.acl"
    commands = "+ping +hello +client|setinfo +xadd +xreadgroup +xgroup|create +xack +xpending"
    aclfile.write_text(f"user default off\nuser dt on >s3cret ~dt:* -@all {commands}\n")
    with private_redis(tmp_path / "acl", "--aclfile", str(aclfile)) as server:
        client = aioredis.Redis.from_url(f"redis://dt:s3cret@127.0.0.1:{server.port}/0", decode_responses=True)
        transport = RedisStreamsTransport(client, make_app().settings.namespace, dedup_ttl=timedelta(hours=1))
        stream = QueueKeys(transport.namespace, "s").stream
        entry_id = await delivered(transport, stream)
        with caplog.at_level(logging.WARNING, logger="durable_tasks.transport.announce"):
            await transport.ack_and_announce({stream: [entry_id]}, outcome_channel(transport.namespace), "m")
        assert await pending(transport, stream) == 0
        assert "announcing outcomes failed (NoPermissionError)" in caplog.text
        await client.aclose()
