"""Flow control's admission for the in-memory transport: ``admit.lua``, ``renew_slots.lua`` and
``set_limit.lua`` computed in Python on the App's clock, with the same rules (GCRA rates,
concurrency slots that expire with their lease, refused deliveries' staggered waits, one
all-or-nothing decision per delivery), including the run-time settings ``App.set_limit`` writes
(a hash kept here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MemoryFlow"]


class MemoryFlow:
    """Rate and concurrency state of one in-memory transport."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        #: Hashes by key (the limits' run-time settings): field -> value.
        self.hashes: dict[str, dict[str, str]] = {}
        self._tats: dict[str, float] = {}
        self._slots: dict[str, dict[str, int]] = {}  # key -> member -> lease expiry (ms)

    def run(self, name: str, keys: list[str], args: Sequence[str | int]) -> Any:
        """The reply the script ``name`` would give."""
        if name == "admit":
            return self._admit(keys, args)
        if name == "renew_slots":
            return self._renew(keys, args)
        if name == "set_limit":  # a compare-and-set of one setting
            settings = self.hashes.setdefault(keys[0], {})
            if settings.get(str(args[0]), "") != args[1]:
                return 0
            settings[str(args[0])] = str(args[2])
            return 1
        raise ValueError(f"the in-memory transport has no script {name!r}")

    def remove(self, key: str, member: str) -> int:
        """ZREM: free one slot."""
        return 1 if self._slots.get(key, {}).pop(member, None) is not None else 0

    def _admit(self, keys: list[str], args: Sequence[str | int]) -> list[int]:
        now = self._now_ms()
        lease, busy_wait, requests = int(args[0]), int(args[1]), json.loads(str(args[2]))
        virtual_tat: dict[str, float] = {}
        waiting: dict[str, int] = {}
        out: list[int] = []
        for request in requests:
            wait = 0.0
            takes: list[tuple[str, str, float]] = []
            for kind, index, name, default, burst in request["c"]:
                key = keys[index - 1]
                raw = self.hashes.get(keys[0], {}).get(name)
                given: dict[str, Any] = json.loads(raw) if raw else {}
                if kind == "r":
                    default, burst = given.get("interval_ms", default), given.get("burst", burst)
                    tat = max(self._tats.get(key, 0.0), now)
                    if tat - now - (burst - 1) * default > 0:
                        vt = max(virtual_tat.get(key, tat), tat)
                        wait = max(wait, vt - now - (burst - 1) * default)
                        takes.append(("v", key, vt + default))
                    else:
                        takes.append(("r", key, tat + default))
                else:
                    default = given.get("concurrency", default)
                    slots = self._slots.setdefault(key, {})
                    for who in [w for w, expiry in slots.items() if expiry <= now]:
                        del slots[who]
                    if request["m"] not in slots and len(slots) >= default:
                        waiting[key] = waiting.get(key, 0) + 1
                        wait = max(wait, busy_wait * waiting[key])
                    else:
                        takes.append(("c", key, 0.0))
            if wait > 0:
                virtual_tat.update({key: value for kind, key, value in takes if kind == "v"})
                out.append(max(1, math.ceil(wait)))
                continue
            for kind, key, value in takes:
                if kind == "r":
                    self._tats[key] = value
                else:
                    self._slots.setdefault(key, {})[request["m"]] = now + lease
            out.append(0)
        return out

    def _renew(self, keys: list[str], args: Sequence[str | int]) -> int:
        expiry = self._now_ms() + int(args[0])
        renewed = 0
        for key, who in zip(keys, args[1:], strict=True):
            slots = self._slots.get(key, {})
            if str(who) in slots:
                slots[str(who)] = expiry
                renewed += 1
        return renewed
