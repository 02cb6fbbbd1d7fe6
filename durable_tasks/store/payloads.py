"""Which payloads a batch statement carries with its rows, and which it leaves to be read alone.

A dispatcher's pass and a worker's claim each read hundreds of task rows at once. Carrying every
payload would make what one batch holds grow with its payloads: a dispatcher pass of 500
payloads of 1 MB peaked at 1 GB, a worker at its default concurrency held 1.1 GB. Each batch
statement carries the payloads up to :data:`INLINE_PAYLOAD_BYTES` and NULL in place of a larger
one, which its reader fetches alone (:meth:`.base.SqlStore.read_payload`) when it needs it: a
dispatcher when it checks it, a worker within its ``payload_memory``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..records import tasks_table

__all__ = ["INLINE_PAYLOAD_BYTES", "inline_payload", "payload_size"]

#: The largest payload a batch statement carries with its row: a pass of 500 rows holds at most
#: 32 MiB of them (up to four times that of tasks written without ``payload_bytes`` on SQLite,
#: whose ``length`` counts characters, in text outside ASCII).
INLINE_PAYLOAD_BYTES = 64 * 1024

t = tasks_table.c


def payload_size() -> sa.ColumnElement[Any]:
    """The payload's size in bytes as submit wrote it (``payload_bytes``), or, for a task written
    without it (older code, ``dt_submit``), measured: bytes on MySQL (``LENGTH``), characters on
    SQLite (``length``, which reads a long value to count them). PostgreSQL's batch statements are
    its own SQL (``octet_length``, which reads a long value's header only).

    On MySQL/MariaDB a statement that names ``payload`` reads every long payload of its rows,
    whatever the CASE then keeps, and a locking read or an update reads the whole row whatever it
    names (``benchmarks/mysql_row_reads.py``)."""
    return sa.func.coalesce(t.payload_bytes, sa.func.length(t.payload))


def inline_payload() -> sa.ColumnElement[Any]:
    """The payload, or NULL when it is over :data:`INLINE_PAYLOAD_BYTES`."""
    return sa.case((payload_size() <= INLINE_PAYLOAD_BYTES, t.payload))
