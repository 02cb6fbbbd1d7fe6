"""The test suite's own clean-up of the shared Redis: it deletes the keys of the namespaces it
was given, and nothing else on a server that other runs and programs share."""

from __future__ import annotations

import uuid

import pytest
import redis

from tests.helpers import delete_namespace_keys


def fresh() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("with_others", [False, True], ids=["one namespace", "several"])
def test_the_session_clean_up_deletes_its_namespaces_keys_and_no_other(redis_url: str, with_others: bool) -> None:
    mine, other = fresh(), fresh()
    kept = [f"dt:{{{other}:jobs}}:stream", f"dt:{{{mine}}}:wake", f"dt:{{{mine}x:jobs}}:stream"]
    client = redis.Redis.from_url(redis_url)
    try:
        for key in [f"dt:{{{mine}:jobs}}:stream", f"dt:{{{mine}:cli}}:dedup:a:0:0", *kept]:
            client.set(key, "1")
        also = [fresh(), fresh()] if with_others else []  # namespaces without keys: the session's sweep
        assert delete_namespace_keys(redis_url, mine, *also) == 2
        assert sorted(client.scan_iter(match=f"dt:{{{mine}*")) == sorted(k.encode() for k in kept[1:])
        assert client.exists(kept[0]) == 1
    finally:
        client.delete(*kept)
        client.close()
