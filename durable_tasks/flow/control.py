"""Changing limits while workers run, and reading them back (``status``, ``durable-tasks
limits``): a limit's run-time setting is a field of one Redis hash that admit.lua reads on
every admission, so a change holds on every worker at its next admission, with no deploy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidFlowControlError
from .gate import FlowKeys
from .policy import Limit, parse_rate

if TYPE_CHECKING:
    from ..tasks import Task
    from ..transport.streams import RedisStreamsTransport

__all__ = ["LimitInfo", "clear_limit", "declared_limits", "read_limits", "write_limit"]


@dataclass(frozen=True, slots=True)
class LimitInfo:
    """A limit as admission applies it now: the code's values, or the run-time setting's."""

    name: str
    rate: str | None
    burst: int
    concurrency: int | None
    #: Whether a run-time setting overrides what the code declares.
    changed: bool


def declared_limits(registry: Mapping[str, Task[Any, Any]], shared: Mapping[str, Limit]) -> dict[str, Limit]:
    """Every limit of an App by name: the shared ones and those tasks declare for themselves."""
    found = dict(shared)
    for task in registry.values():
        for limit in task.flow.limits:
            found.setdefault(limit.name, limit)
    return found


async def read_limits(transport: RedisStreamsTransport, namespace: str, limits: Iterable[Limit]) -> list[LimitInfo]:
    """The limits as they apply now, in name order."""
    ordered = sorted(limits, key=lambda limit: limit.name)
    if not ordered:
        return []
    raw = await transport.client.hmget(FlowKeys(namespace).settings, [limit.name for limit in ordered])
    out: list[LimitInfo] = []
    for limit, setting in zip(ordered, raw, strict=True):
        given = json.loads(setting) if setting else {}
        out.append(
            LimitInfo(
                limit.name,
                given.get("rate", None if limit.rate is None else str(limit.rate)),
                int(given.get("burst", limit.burst)),
                given.get("concurrency", limit.concurrency),
                bool(given),
            )
        )
    return out


async def write_limit(
    transport: RedisStreamsTransport,
    namespace: str,
    limit: Limit,
    *,
    rate: str | None = None,
    burst: int | None = None,
    concurrency: int | None = None,
) -> None:
    """Override some of ``limit``'s values on every worker (kept until :func:`clear_limit`).
    The values not given keep their setting, even when another call changes them meanwhile."""
    changes: dict[str, Any] = {}
    if rate is not None:
        if limit.rate is None:
            raise InvalidFlowControlError(f"limit {limit.name!r} has no rate in the code; declare one to change it")
        parsed = parse_rate(rate)
        changes["interval_ms"], changes["rate"] = parsed.interval_ms, str(parsed)
    if burst is not None:
        if burst < 1:
            raise InvalidFlowControlError(f"burst={burst}: pass 1 or more")
        changes["burst"] = burst
    if concurrency is not None:
        if limit.concurrency is None or concurrency < 1:
            raise InvalidFlowControlError(
                f"concurrency={concurrency} for {limit.name!r}: the limit must declare one, and 1 or more"
            )
        changes["concurrency"] = concurrency
    key = FlowKeys(namespace).settings
    while True:  # set_limit.lua writes only over the setting read: read again after another write
        current = await transport.client.hget(key, limit.name)
        merged = (json.loads(current) if current else {}) | changes
        if await transport.run_script("set_limit", [key], [limit.name, current or "", json.dumps(merged)]):
            return


async def clear_limit(transport: RedisStreamsTransport, namespace: str, name: str) -> bool:
    """Drop ``name``'s run-time setting (the code's values apply again); False if it had none."""
    return bool(await transport.client.hdel(FlowKeys(namespace).settings, name))
