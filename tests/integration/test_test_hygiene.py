"""The test suite's own clean-up of the shared Redis: it deletes the keys of the namespaces it
was given, and nothing else on a server that other runs and programs share."""

from __future__ import annotations

import uuid

import redis

from tests.helpers import delete_keys_of


def test_the_session_clean_up_deletes_its_namespaces_keys_and_no_other(redis_url: str) -> None:
    mine, other = f"t{uuid.uuid4().hex[:12]}", f"t{uuid.uuid4().hex[:12]}"
    kept = [f"dt:{{{other}:jobs}}:stream", f"dt:{{{mine}}}:wake", f"dt:{{{mine}x:jobs}}:stream"]
    client = redis.Redis.from_url(redis_url)
    try:
        for key in [f"dt:{{{mine}:jobs}}:stream", f"dt:{{{mine}:cli}}:dedup:a:0:0", *kept]:
            client.set(key, "1")
        assert delete_keys_of(redis_url, [mine]) == 2
        assert sorted(client.scan_iter(match=f"dt:{{{mine}*")) == sorted(k.encode() for k in kept[1:])
        assert client.exists(kept[0]) == 1
    finally:
        client.delete(*kept)
        client.close()
