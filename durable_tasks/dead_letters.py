"""A queue's dead-letter stream read against the database.

An entry says that generation ``g`` of a task was dead-lettered. Once the task is rerun (``App.rerun``,
``durable-tasks tasks rerun``, a replay, the dashboard), that generation is fenced out and the
task is live again: its entry no longer asks anything of an operator. The database says which
generation a task is at, so the entries of tasks rerun since are deleted wherever the DLQ is
read (the operator's lists, a replay) and by every reaper pass (the DLQ-length gauge), whatever
path reran the task and even if Redis was unreachable when it did.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .policy import TaskLeaseView
from .runtime import Runtime
from .store.ids import is_task_id_shaped
from .transport.streams import stream_id_order

__all__ = [
    "DeadLetter",
    "dead_letter_pages",
    "dead_letters_by_id",
    "forget_rerun",
    "forget_rerun_oldest",
    "read_dead_letters",
    "rerun_since",
]

#: Entries one reaper pass checks per queue at most (oldest first).
REAPER_PAGE = 1000

#: A whole stream entry id (``XRANGE id id`` of a bare ``ms`` would match every ``ms-*``).
_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ entry: which task delivery it was and why it landed here (never the payload)."""

    entry_id: str
    task_id: str | None
    name: str | None
    generation: int | None
    reason: str


def _parse(entry_id: str, fields: dict[str, str]) -> DeadLetter:
    generation = fields.get("g")
    return DeadLetter(
        entry_id=entry_id,
        task_id=fields.get("t"),
        name=fields.get("n"),
        generation=int(generation) if generation and generation.isdigit() else None,
        reason=fields.get("dt_reason", ""),
    )


def rerun_since(letters: Sequence[DeadLetter], tasks: Mapping[str, TaskLeaseView]) -> list[DeadLetter]:
    """The letters whose task is at a later generation now (rerun since); a letter naming no
    task, or a task no longer in the database, is not."""
    return [
        d
        for d in letters
        if d.task_id is not None
        and d.task_id in tasks
        and d.generation is not None
        and tasks[d.task_id].generation > d.generation
    ]


async def forget_rerun(runtime: Runtime, queue: str, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """Delete the entries of tasks rerun since they were dead-lettered; return the others."""
    # A malformed entry's fields are whatever was written to Redis: only a possible task id
    # (36 printable characters at most, as the column) is looked up.
    ids = {d.task_id for d in letters if is_task_id_shaped(d.task_id)}
    if not ids:
        return list(letters)
    gone = rerun_since(letters, await runtime.store.lease_views(runtime.settings.namespace, ids))
    if gone:
        await runtime.transport().forget_dead_letters(queue, [d.entry_id for d in gone])
    return [d for d in letters if d not in gone]


async def read_dead_letters(
    runtime: Runtime, queue: str, *, count: int = 100, after: str | None = None
) -> list[DeadLetter]:
    """The oldest ``count`` entries of the queue's DLQ whose task was not rerun since, or the
    ``count`` after the entry id ``after`` (a page: XRANGE from an exclusive key, however long
    the DLQ); the entries of tasks rerun are deleted on the way."""
    found: list[DeadLetter] = []
    while (wanted := count - len(found)) > 0:
        page = await _page(runtime, queue, after, wanted)
        found += await forget_rerun(runtime, queue, page)
        if len(page) < wanted:  # the end of the stream
            break
        after = page[-1].entry_id
    return found


async def forget_rerun_oldest(runtime: Runtime, queue: str) -> int:
    """The reaper's share: delete the entries of tasks rerun since among the oldest
    ``REAPER_PAGE`` of the DLQ; returns how many."""
    page = await _page(runtime, queue, None, REAPER_PAGE)
    return len(page) - len(await forget_rerun(runtime, queue, page))


async def _page(runtime: Runtime, queue: str, after: str | None, count: int) -> list[DeadLetter]:
    return [_parse(i, f) for i, f in await runtime.transport().dead_letter_page(queue, after=after, count=count)]


async def dead_letters_by_id(
    runtime: Runtime, queue: str, entry_ids: Sequence[str]
) -> tuple[list[DeadLetter], list[str]]:
    """The entries of these ids, wherever they stand in the DLQ (``XRANGE id id`` each, in one
    pipelined round trip), as written; and the ids the DLQ does not hold (not an entry id, or
    no such entry)."""
    wanted = list(dict.fromkeys(entry_ids))
    ids = [i for i in wanted if _ENTRY_ID.fullmatch(i)]
    transport = runtime.transport()
    dlq = transport.keys(queue).dlq
    replies: list[list[tuple[str, dict[str, str]]]] = []
    if ids:
        async with transport.client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.xrange(dlq, min=entry_id, max=entry_id)
            replies = await pipe.execute()
    found = [_parse(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for reply in replies for i, f in reply]
    held = {d.entry_id for d in found}
    return found, [i for i in wanted if i not in held]


async def dead_letter_pages(
    runtime: Runtime, queue: str, *, count: int = REAPER_PAGE
) -> AsyncIterator[list[DeadLetter]]:
    """Every entry of the queue's DLQ as written, oldest first, ``count`` a page, up to the
    newest one when the walk starts (one added meanwhile, such as a task dead-lettered again
    after its replay, is the next walk's)."""
    transport = runtime.transport()
    newest: Any = await transport.client.xrevrange(transport.keys(queue).dlq, count=1)
    if not newest:
        return
    last = stream_id_order(str(newest[0][0]))
    after: str | None = None
    while page := await _page(runtime, queue, after, count):
        yield [d for d in page if stream_id_order(d.entry_id) <= last]
        if len(page) < count or stream_id_order(page[-1].entry_id) >= last:
            return
        after = page[-1].entry_id
