"""Operator actions on a queue's dead-letter stream.

Replay never XADDs by hand: it starts a new generation of the task through the outbox
(``App.rerun``), the same path as any delivery, then removes the DLQ entry. A task rerun any
other way loses its entry too, the next time the DLQ is read or the reaper passes
(:mod:`.dead_letters`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import Session

from .dead_letters import DeadLetter, read_dead_letters
from .errors import TaskNotFoundError

if TYPE_CHECKING:
    from .app import App

__all__ = ["DeadLetter", "list_dead_letters", "purge", "replay"]


async def list_dead_letters(app: App, queue: str, *, count: int = 100, after: str | None = None) -> list[DeadLetter]:
    """The oldest ``count`` entries of the queue's DLQ, or the ``count`` entries after the entry
    id ``after`` (a page: XRANGE from an exclusive key, however long the DLQ). Entries of tasks
    rerun since they were dead-lettered are not listed, and deleted (:mod:`.dead_letters`)."""
    return await read_dead_letters(app.runtime, queue, count=count, after=after)


async def replay(app: App, queue: str, entry_ids: list[str] | None = None) -> list[str]:
    """Rerun the tasks of the given DLQ entries (all when None); returns the task ids rerun.

    Entries that name no task (malformed) or a task that no longer exists stay in the DLQ.
    """
    letters = await list_dead_letters(app, queue, count=10_000)
    chosen = [d for d in letters if entry_ids is None or d.entry_id in entry_ids]
    rerun: list[str] = []
    dlq = app.runtime.transport().keys(queue).dlq
    for letter in chosen:
        if letter.task_id is None:
            continue
        try:
            with Session(app.engine) as session:
                app.rerun(session, letter.task_id)
                session.commit()
        except TaskNotFoundError:
            continue
        await app.runtime.transport().client.xdel(dlq, letter.entry_id)
        rerun.append(letter.task_id)
    return rerun


async def purge(app: App, queue: str, entry_ids: list[str] | None = None) -> int:
    """Delete DLQ entries (all when None); the tasks stay DEAD in the database."""
    dlq = app.runtime.transport().keys(queue).dlq
    client = app.runtime.transport().client
    if entry_ids is None:
        count = int(await client.xlen(dlq))
        await client.delete(dlq)
        return count
    return int(await client.xdel(dlq, *entry_ids)) if entry_ids else 0
