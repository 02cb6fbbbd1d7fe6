"""Announcing settled outcomes to result waits: one PUBLISH per committed group.

Called after the fenced commit, never before: a wait woken by an announcement finds what it
says in the database. An announcement that fails is logged and dropped; waits learn the
outcome from their fallback read (:mod:`durable_tasks.waiting`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from ..outcome import TaskOutcome, encode_outcomes
from .keys import outcome_channel

__all__ = ["announce", "announce_failed", "announce_outcomes", "announcement"]

logger = logging.getLogger(__name__)


def announcement(namespace: str, outcomes: Sequence[TaskOutcome], *, inline_bytes: int) -> tuple[str, str | None]:
    """The namespace's outcome channel and the message for ``outcomes`` (None when there are none)."""
    return outcome_channel(namespace), encode_outcomes(outcomes, inline_bytes=inline_bytes) if outcomes else None


async def announce(client: Any, channel: str, message: str | None) -> None:
    """PUBLISH ``message`` on ``channel`` (nothing for None); a failure is logged and dropped."""
    if message is None:
        return
    try:
        await client.publish(channel, message)
    except (RedisError, OSError) as exc:
        announce_failed(exc)


def announce_failed(exc: BaseException) -> None:
    """Log an announcement that did not go out: it is dropped, and result waits read the
    outcomes from the database."""
    logger.warning("announcing outcomes failed (%s); waits will read them", type(exc).__name__)


async def announce_outcomes(client: Any, namespace: str, outcomes: Sequence[TaskOutcome], *, inline_bytes: int) -> None:
    """PUBLISH ``outcomes`` on the namespace's outcome channel (nothing when there are none)."""
    await announce(client, *announcement(namespace, outcomes, inline_bytes=inline_bytes))
