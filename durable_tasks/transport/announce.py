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

__all__ = ["announce_outcomes"]

logger = logging.getLogger(__name__)


async def announce_outcomes(client: Any, namespace: str, outcomes: Sequence[TaskOutcome], *, inline_bytes: int) -> None:
    """PUBLISH ``outcomes`` on the namespace's outcome channel (nothing when there are none)."""
    if not outcomes:
        return
    try:
        await client.publish(outcome_channel(namespace), encode_outcomes(outcomes, inline_bytes=inline_bytes))
    except (RedisError, OSError) as exc:
        logger.warning("announcing %d outcomes failed (%s); waits will read them", len(outcomes), type(exc).__name__)
