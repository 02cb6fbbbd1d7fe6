"""Opening and closing the Redis client behind a transport: plain or cluster URLs, seed lists."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

from ..settings import Settings
from .cluster_url import is_cluster_url, split_seeds
from .streams import RedisStreamsTransport

__all__ = ["close_stale", "open_transport"]


def open_transport(url: str, settings: Settings) -> RedisStreamsTransport:
    """A transport for ``url`` (``redis+cluster://`` or ``settings.redis_cluster`` for a cluster).

    Undecodable bytes in an entry must not break every read: they become U+FFFD, the entry is
    then malformed, and it goes to the DLQ.
    """
    cluster = settings.redis_cluster or is_cluster_url(url)
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
    """A cluster client on every seed of ``url`` (durable_tasks.transport.cluster_url)."""
    first, others = split_seeds(url)
    return aioredis.RedisCluster.from_url(
        first,
        startup_nodes=[ClusterNode(host, port) for host, port in others],
        decode_responses=True,
        encoding_errors="replace",
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
        if sock is None or sock.fileno() < 0:
            continue
        # On a second descriptor of the same socket: the loop's own socket object may refuse
        # shutdown() (uvloop's does), while a shutdown reaches the connection from any descriptor.
        with contextlib.suppress(OSError), socket.fromfd(sock.fileno(), sock.family, sock.type) as dup:
            dup.shutdown(socket.SHUT_RDWR)


def _connections(client: Any) -> list[Any]:
    if isinstance(client, aioredis.RedisCluster):
        return [c for node in client.get_nodes() for c in getattr(node, "_connections", ())]
    pool = client.connection_pool
    return [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]
