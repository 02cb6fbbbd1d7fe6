"""What ``submit`` checks about its caller's side: that it was given a Session, and that a
repeated idempotency key comes with the same payload.

A task intent is written in the caller's transaction, which only an ORM ``Session`` carries:
an Engine has no transaction to join, a bare Connection's commit is the caller's to make in a
way submit cannot see. An idempotency key names one request: the same key with a different
payload is two requests sharing an id, and quietly returning the first task would drop the
second payload. Both are the caller's mistakes, reported as typed errors saying what to pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from .errors import IdempotencyConflictError, InvalidSessionError
from .records import tasks_table
from .store.payloads import stored_payload
from .store.retention import delete_tasks
from .store.submit import SubmitOutcome

__all__ = ["check_same_payloads", "check_session", "undo_submits"]

t = tasks_table.c


def check_session(session: object, method: str) -> None:
    """Raise InvalidSessionError, saying what to pass, unless ``session`` is an ORM Session."""
    if isinstance(session, Session):
        return
    usage = f"with Session(engine) as session: app.{method}(session, ...); session.commit()"
    if isinstance(session, sa.Engine):
        raise InvalidSessionError(
            f"app.{method} takes the Session of your transaction, not an Engine: {usage}. "
            "The task is committed with your own rows in that transaction."
        )
    if isinstance(session, sa.Connection):
        raise InvalidSessionError(
            f"app.{method} takes a Session, not a Connection: wrap the connection, "
            f"Session(bind=connection), and pass that (its transaction is the connection's)."
        )
    kind = type(session).__name__
    if kind == "AsyncSession":
        raise InvalidSessionError(f"app.{method} takes a sync Session; with an AsyncSession use app.asubmit")
    raise InvalidSessionError(f"app.{method} takes a sqlmodel/SQLAlchemy Session, not {kind}: {usage}")


def check_same_payloads(
    session: Session, task_name: str, submitted: Sequence[tuple[str, str | None]], outcomes: Sequence[SubmitOutcome]
) -> None:
    """Raise IdempotencyConflictError when a submit resolved to an existing task (same name and
    key) whose stored payload differs from the one submitted. JSON values are compared, not
    their text, so key order does not matter. One read, only when a key was a duplicate."""
    repeated = [
        (payload_json, key, o.task_id)
        for (payload_json, key), o in zip(submitted, outcomes, strict=True)
        if key is not None and not o.created
    ]
    if not repeated:
        return
    stored = dict(
        session.connection()
        .execute(sa.select(t.id, stored_payload()).where(t.id.in_({task_id for _, _, task_id in repeated})))
        .all()
    )
    for payload_json, key, task_id in repeated:
        if not _same_json(_loads(stored.get(task_id)), _loads(payload_json)):
            raise IdempotencyConflictError(
                f"idempotency_key {key!r} was already used for task {task_name!r} (task {task_id}) with a "
                "different payload: give this request a key of its own, or submit the same payload to get "
                "that task back",
                task_id=task_id,
                idempotency_key=key,
            )


def undo_submits(session: Session, task_ids: Sequence[str]) -> None:
    """Delete the tasks (their outbox rows, payloads kept apart) a submit inserted in this
    transaction, as a prune deletes old ones (:func:`.store.retention.delete_tasks`)."""
    if task_ids:
        delete_tasks(session.connection(), task_ids)


def _same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same value: Python's ``==`` takes ``true`` for
    ``1`` and ``false`` for ``0``, which JSON tells apart (``1`` and ``1.0`` are one number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)  # containers of different kinds are never equal


def _loads(text: str | None) -> Any:
    try:
        return json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return text
