"""Task ids: UUIDv7 (RFC 9562), a millisecond timestamp then 74 random bits.

A task's row, its outbox rows and its attempts are found by task id on every hot statement
(the claim, the group commit, the mark-``SENT``), and the primary key of ``dt_tasks`` grows by
one entry per submit. With random ids (UUIDv4) each of those touches a random leaf page of
indexes that, with millions of finished tasks kept, no longer fit in PostgreSQL's buffers;
time-ordered ids keep the tasks in flight on the few recent leaf pages. The random part keeps
ids unguessable (``secrets``); ids stay 36-character strings, and their text order is their
time order.
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import TypeGuard

from ..settings import printable_text

__all__ = ["is_task_id_shaped", "new_task_id"]

_VERSION = 0x7 << 76
_VARIANT = 0x2 << 62
#: The clock the timestamp comes from (a test sets its own).
_now_ns = time.time_ns


def is_task_id_shaped(task_id: object) -> TypeGuard[str]:
    """Whether ``task_id`` could name a task: ids are 36 printable characters. Anything else
    names none and is answered without a query (a NUL byte or a lone surrogate would be refused
    by the driver or the server, as if the database were at fault)."""
    return printable_text(task_id, 36)


def new_task_id() -> str:
    """A fresh task id: time-ordered to the millisecond, random within it."""
    millis = _now_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF
    random = secrets.randbits(74)
    value = millis << 80 | _VERSION | (random >> 62) << 64 | _VARIANT | random & 0x3FFF_FFFF_FFFF_FFFF
    return str(uuid.UUID(int=value))
