"""What a payload at the size limit costs to encode (submit) and decode (dispatcher, worker), by
shape: one long string, an object of as many short keys as fit, an array of as many small
numbers as fit. The size limit bounds the count of members, so no limit of its own does
(docs/security.md says why).

    python -m benchmarks.payload_shapes [--bytes 1048576] [--rounds 5]

Prints, per shape and payload type (``Any``, and the typed one a handler would declare), its
members, its bytes and the median milliseconds of ``encode_payload`` and ``decode_payload``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import TypeAdapter

from durable_tasks.codec import decode_payload, encode_payload


def shapes(limit: int) -> list[tuple[str, Any, TypeAdapter[Any], int]]:
    """(name, value, its typed adapter, members) for each shape, each just under ``limit`` bytes."""
    keys = (limit - 2) // len('"k100000":0,')
    numbers = (limit - 2) // len("0,")
    return [
        ("a string", "x" * (limit - 16), TypeAdapter(str), 1),
        ("an object of short keys", {f"k{i}": 0 for i in range(keys)}, TypeAdapter(dict[str, int]), keys),
        ("an array of small numbers", [0] * numbers, TypeAdapter(list[int]), numbers),
    ]


def median_ms(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=1024 * 1024, help="the size limit (DT_MAX_PAYLOAD_BYTES)")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    for name, value, typed, members in shapes(a.bytes):
        for type_name, adapter in (("Any", TypeAdapter(Any)), ("typed", typed)):
            encode = partial(encode_payload, adapter, value, task="probe", max_bytes=a.bytes, max_depth=64)
            text = encode()
            decode = partial(decode_payload, adapter, text, task="probe")
            print(
                f"{name:26} {type_name:5} {members:>8,} members {len(text):>9,} B  "
                f"encode {median_ms(encode, a.rounds):7.1f} ms  decode {median_ms(decode, a.rounds):6.1f} ms"
            )


if __name__ == "__main__":
    main()
