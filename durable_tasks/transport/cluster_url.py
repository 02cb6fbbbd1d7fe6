"""The seed nodes of a Redis Cluster URL, for every client the library opens on a cluster.

``redis+cluster://h1:p1,h2:p2,h3:p3/0?ssl_ca_certs=...`` names several seeds, so the loss of
one of them does not stop a (re)connect. redis-py parses only a URL with one host, so the URL
is cut to its first seed, and the others join as startup nodes. Everything else in the URL
(credentials, ``rediss`` and its ``ssl_*`` options, the path) is kept: it applies to every
node, and a client that lost the query string would talk TLS without the CA it was given.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import ClusterNode

__all__ = ["is_cluster_url", "split_seeds", "sync_cluster_client"]


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a cluster by its scheme (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.startswith(("redis+cluster://", "rediss+cluster://"))


def split_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """``url`` (without ``+cluster``) with its first seed alone, and the other seeds' (host, port)."""
    if is_cluster_url(url):
        url = url.replace("+cluster", "", 1)
    scheme, _, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]  # tail: the path and the query, as given
    userinfo, _, hosts = netloc.rpartition("@")
    seeds = []
    for hostport in hosts.split(","):
        host, colon, port = hostport.rpartition(":")
        if not colon:  # a host without a port
            host, port = hostport, ""
        seeds.append((host or "127.0.0.1", int(port or 6379)))
    first = f"{scheme}://{userinfo + '@' if userinfo else ''}{hosts.split(',')[0]}{tail}"
    return first, seeds[1:]


def sync_cluster_client(url: str, **options: Any) -> Any:
    """A (synchronous) ``redis.RedisCluster`` on every seed of ``url``; ``options`` go to each node."""
    first, others = split_seeds(url)
    node: Any = ClusterNode  # redis-py's synchronous ClusterNode is not annotated
    return redis.RedisCluster.from_url(first, startup_nodes=[node(host, port) for host, port in others], **options)
