"""split_seeds: a cluster URL becomes its first seed with everything else it says (credentials,
path, the TLS options in its query) and the other seeds; every cluster client uses it."""

from __future__ import annotations

import pytest

from durable_tasks.transport.cluster_url import is_cluster_url, split_seeds

CA = "ssl_ca_certs=/pki/ca.pem&ssl_certfile=/pki/client.pem&ssl_keyfile=/pki/client.key"


@pytest.mark.parametrize(
    ("url", "first", "others"),
    [
        (
            f"rediss+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002/0?{CA}",
            f"rediss://127.0.0.1:7000/0?{CA}",
            [("127.0.0.1", 7001), ("127.0.0.1", 7002)],
        ),
        (f"rediss+cluster://h1:7000,h2:7001?{CA}", f"rediss://h1:7000?{CA}", [("h2", 7001)]),
        ("redis+cluster://dt:p@ss@h1:7000,h2/0", "redis://dt:p@ss@h1:7000/0", [("h2", 6379)]),
        ("redis+cluster://h1:7000", "redis://h1:7000", []),
        ("redis://h1:7000/0", "redis://h1:7000/0", []),  # a plain URL with Settings.redis_cluster
    ],
)
def test_the_first_seed_keeps_the_rest_of_the_url(url: str, first: str, others: list[tuple[str, int]]) -> None:
    assert split_seeds(url) == (first, others)


def test_a_cluster_is_named_by_its_scheme() -> None:
    assert is_cluster_url("redis+cluster://h:1")
    assert is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:1/0?x=+cluster://")
