"""What travels on a stream: a reference to a durable intent, never the payload itself.

Entries carry ids only (task, generation, delivery, name, trace context); the worker reads
the payload from the database under its execution fence. Nothing in a stream is ever
deserialized as code, so an entry written by a stranger can at worst name a task that the
fence then refuses.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..immutable import immutable

__all__ = [
    "AutoclaimPage",
    "Delivery",
    "MalformedEntryError",
    "OutgoingMessage",
    "StreamEntry",
    "entry_mac",
    "parse_autoclaim_reply",
    "parse_delivery",
]


@immutable
class OutgoingMessage:
    """One delivery to publish: the outbox row's identity and where it goes."""

    queue: str
    task_id: str
    generation: int
    delivery: int
    name: str
    traceparent: str | None = None
    shadow: bool = False
    partition: int | None = None
    #: Flow control: the level stream it travels on, and the key its concurrency limit counts.
    priority: int = 0
    concurrency_key: str | None = None

    def fields(self, stream: str = "", key: bytes | None = None) -> dict[str, str]:
        """The stream entry's fields, signed for ``stream`` when a signing key is set."""
        out = {
            "t": self.task_id,
            "g": str(self.generation),
            "d": str(self.delivery),
            "n": self.name,
        }
        if self.traceparent:
            out["tp"] = self.traceparent
        if self.concurrency_key is not None:
            out["k"] = self.concurrency_key
        if key is not None:
            out["s"] = entry_mac(key, stream, out)
        return out


def entry_mac(key: bytes, stream: str, fields: Mapping[str, str]) -> str:
    """HMAC-SHA256 of what an entry asks for, bound to the stream it travels on (an entry
    copied to another queue does not verify)."""
    parts = [stream, *(fields.get(f, "") for f in ("t", "g", "d", "n", "tp"))]
    if "k" in fields:  # only when present: entries without a concurrency key sign as before
        parts.append(fields["k"])
    signed = "\x1f".join(parts)
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


@immutable
class StreamEntry:
    """An entry as read from a stream, fields untouched."""

    queue: str
    shadow: bool
    entry_id: str
    fields: Mapping[str, str]
    stream: str = ""
    partition: int | None = None


@immutable
class Delivery:
    """A parsed entry: which delivery of which task generation it carries."""

    task_id: str
    generation: int
    delivery: int
    name: str
    traceparent: str | None
    #: The key a per-key concurrency limit counts (durable_tasks.flow), if the submit gave one.
    concurrency_key: str | None = None


class MalformedEntryError(ValueError):
    """A stream entry lacks a field or holds garbage; it cannot name a task delivery."""


def parse_delivery(fields: Mapping[str, str], *, stream: str = "", key: bytes | None = None) -> Delivery:
    """Read a delivery out of entry fields, or raise :class:`MalformedEntryError`.

    With a signing ``key``, an entry that is unsigned or whose signature does not match is
    malformed too: whoever can write to Redis but lacks the key cannot make a worker run a task.
    """
    try:
        task_id, name = fields["t"], fields["n"]
        generation, delivery = int(fields["g"]), int(fields["d"])
    except (KeyError, ValueError, TypeError) as exc:
        raise MalformedEntryError(f"entry fields {sorted(fields)!r} are not a delivery: {exc!r}") from exc
    if not task_id or len(task_id) > 36 or not name or generation < 0 or delivery < 0:
        raise MalformedEntryError(f"entry names no valid task delivery: {dict(fields)!r}")
    if key is not None:
        signature = fields.get("s")
        if not signature:
            raise MalformedEntryError("entry is not signed and signing is on: refused unexecuted")
        if not hmac.compare_digest(signature, entry_mac(key, stream, fields)):
            raise MalformedEntryError("entry signature does not match: refused unexecuted")
    return Delivery(task_id, generation, delivery, name, fields.get("tp"), fields.get("k"))


@dataclass(frozen=True, slots=True)
class AutoclaimPage:
    """One XAUTOCLAIM reply: the next cursor, claimed entries, ids dropped as deleted."""

    cursor: str
    entries: list[tuple[str, dict[str, str]]]
    deleted: list[str]


def parse_autoclaim_reply(reply: Sequence[Any]) -> AutoclaimPage:
    """Normalize XAUTOCLAIM replies of every server version.

    Redis 6.2 replies ``[cursor, entries]`` and reports an entry deleted from the stream as an
    entry without fields (or a bare nil, skipped: its id is unknown); Redis/Valkey 7+ add a
    third element listing such ids, which the server has already removed from the PEL.
    """
    cursor = str(reply[0])
    entries: list[tuple[str, dict[str, str]]] = []
    deleted = [str(i) for i in reply[2]] if len(reply) > 2 and reply[2] else []
    for item in reply[1] or []:
        if item is None or item[0] is None:
            # Redis 6.2 reports an entry deleted while pending as a bare nil: its id is
            # unknown, and the server keeps it in the PEL. 7.0+ lists such ids instead.
            continue
        entry_id, raw = item[0], item[1]
        if raw is None:
            deleted.append(str(entry_id))
        elif isinstance(raw, Mapping):
            entries.append((str(entry_id), {str(k): str(v) for k, v in raw.items()}))
        else:
            flat = list(raw)
            entries.append((str(entry_id), {str(k): str(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}))
    return AutoclaimPage(cursor, entries, deleted)
