"""Operator actions on a queue's dead-letter stream.

Replay never XADDs by hand: it starts a new generation of the task through the outbox (the
store's rerun, as ``App.rerun``), the same path as any delivery, then removes the DLQ entry.
It reruns a task only if it is still what its entry dead-lettered, DEAD at the entry's
generation, checked under the task row's lock in the rerun's transaction: two operators
replaying the same entry at once (the dashboard and the CLI) start one generation, and the
later one finds the task rerun since. A task rerun any other way loses its entry too, the
next time the DLQ is read or the reaper passes (:mod:`.dead_letters`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from anyio import to_thread
from sqlmodel import Session

from .dead_letters import DeadLetter, dead_letter_pages, dead_letters_by_id, forget_rerun, read_dead_letters
from .outages import database_errors
from .records import TaskState
from .store.ids import is_task_id_shaped

if TYPE_CHECKING:
    from .app import App

__all__ = ["DeadLetter", "Replay", "list_dead_letters", "purge", "replay", "rerun_as_listed"]


async def list_dead_letters(app: App, queue: str, *, count: int = 100, after: str | None = None) -> list[DeadLetter]:
    """The oldest ``count`` entries of the queue's DLQ, or the ``count`` entries after the entry
    id ``after`` (a page: XRANGE from an exclusive key, however long the DLQ). Entries of tasks
    rerun since they were dead-lettered are not listed, and deleted (:mod:`.dead_letters`)."""
    return await read_dead_letters(app.runtime, queue, count=count, after=after)


@dataclass(slots=True)
class Replay:
    """What a replay did with each entry it read."""

    #: The tasks given a new generation (their entries deleted).
    rerun: list[str] = field(default_factory=list)
    #: Entries whose task was rerun since it was dead-lettered (by another replay, ``tasks
    #: rerun``, the dashboard): nothing rerun, the entry deleted as every DLQ read does.
    rerun_since: list[str] = field(default_factory=list)
    #: Entries left in the DLQ: naming no task (malformed), a task no longer in the database,
    #: or one not DEAD at the entry's generation.
    kept: list[str] = field(default_factory=list)
    #: Entry ids asked for that the DLQ does not hold.
    not_found: list[str] = field(default_factory=list)


async def replay(app: App, queue: str, entry_ids: Collection[str] | None = None) -> Replay:
    """Rerun the tasks of the given DLQ entries, wherever they stand in the DLQ (all when None:
    every entry up to the newest one when the replay starts, a page at a time)."""
    done = Replay()
    if entry_ids is not None:
        letters, done.not_found = await dead_letters_by_id(app.runtime, queue, list(entry_ids))
        await _replay_letters(app, queue, letters, done)
        return done
    async for page in dead_letter_pages(app.runtime, queue):
        await _replay_letters(app, queue, page, done)
    return done


async def _replay_letters(app: App, queue: str, letters: list[DeadLetter], done: Replay) -> None:
    dlq = app.runtime.transport().keys(queue).dlq
    for letter in letters:
        task_id, generation = letter.task_id, letter.generation
        if task_id is None or generation is None or not is_task_id_shaped(task_id):
            done.kept.append(letter.entry_id)
            continue
        if await to_thread.run_sync(_rerun_dead, app, task_id, generation) is not None:
            await app.runtime.transport().client.xdel(dlq, letter.entry_id)
            done.rerun.append(task_id)
        elif await forget_rerun(app.runtime, queue, [letter]):  # returned: not rerun since, kept
            done.kept.append(letter.entry_id)
        else:
            done.rerun_since.append(letter.entry_id)


def _rerun_dead(app: App, task_id: str, generation: int) -> int | None:
    with Session(app.engine) as session:
        rerun = rerun_as_listed(app, session, task_id, generation=generation, states=(TaskState.DEAD,))
        session.commit()
    return rerun


def rerun_as_listed(
    app: App, session: Session, task_id: str, *, generation: int | None = None, states: Collection[str]
) -> int | None:
    """Start a new generation of a task an operator listed, in ``session``'s transaction, only
    if it is still in one of ``states`` (and at ``generation``, when given): checked under the
    row's lock, so operators acting at once on one list rerun each task once. Returns the new
    generation, or None (nothing written) if the task changed since, or is gone."""
    if not is_task_id_shaped(task_id):
        return None
    with database_errors(lambda: app.engine):
        rerun = app.runtime.store.rerun(
            session,
            app.settings.namespace,
            task_id,
            app.clock(),
            expected_generation=generation,
            expected_states=frozenset(states),
        )
    if rerun is not None:
        app.runtime.wake_dispatchers_after_commit(session)
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
