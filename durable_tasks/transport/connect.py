"""Opening and closing the Redis client behind a transport: plain or cluster URLs, seed lists."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

from ..settings import Settings
from .streams import RedisStreamsTransport

__all__ = ["close_stale", "open_transport"]


def open_transport(url: str, settings: Settings) -> RedisStreamsTransport:
    """A transport for ``url`` (``redis+cluster://`` or ``settings.redis_cluster`` for a cluster).

    Undecodable bytes in an entry must not break every read: they become U+FFFD, the entry is
    then malformed, and it goes to the DLQ.
    """
    cluster = settings.redis_cluster
    if url.startswith("redis+cluster://") or url.startswith("rediss+cluster://"):
        url, cluster = url.replace("+cluster", "", 1), True
    client: aioredis.Redis | aioredis.RedisCluster = (
        _cluster_client(url)
        if cluster
        else aioredis.Redis.from_url(url, decode_responses=True, encoding_errors="replace")
    )
    key = settings.signing_key
    return RedisStreamsTransport(
        client,
        settings.namespace,
        dedup_ttl=settings.dedup_ttl,
        partitions=settings.queue_partitions,
        signing_key=key.get_secret_value().encode() if key else None,
    )


def _cluster_client(url: str) -> aioredis.RedisCluster:
    """A cluster client; ``redis://h1:p1,h2:p2/0`` names several seed nodes, so the loss of
    one of them does not stop a (re)connect. Everything else in the URL (credentials,
    ``rediss`` and its ``ssl_*`` options) applies to every node."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    seeds = []
    for hostport in hosts.split(","):
        host, _, port = hostport.rpartition(":")
        seeds.append(ClusterNode(host or "127.0.0.1", int(port or 6379)))
    # The URL with its first seed alone: redis-py parses it as for one node (TLS options
    # included), and the other seeds join as startup nodes.
    first = f"{scheme}://{userinfo + '@' if userinfo else ''}{hosts.split(',')[0]}{slash}{path}"
    return aioredis.RedisCluster.from_url(
        first, startup_nodes=seeds[1:], decode_responses=True, encoding_errors="replace"
    )


def close_stale(transport: RedisStreamsTransport) -> None:
    """Close the connections of a transport whose event loop is gone, without that loop.

    redis.asyncio closes a connection through its loop, which has finished; so each socket is
    shut down here instead (the server drops the client at once; the descriptor goes with the
    garbage). redis-py lists a client's connections only in private attributes: a version that
    renames them leaves the sockets to the garbage collector, as before.
    """
    for connection in _connections(transport.client):
        writer = getattr(connection, "_writer", None)
        if writer is None:
            continue
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _connections(client: Any) -> list[Any]:
    if isinstance(client, aioredis.RedisCluster):
        return [c for node in client.get_nodes() for c in getattr(node, "_connections", ())]
    pool = client.connection_pool
    return [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]
