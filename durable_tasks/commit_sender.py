"""The process's one thread that sends what committed transactions owe Redis
(:mod:`.commit_publish`), and the round trip it makes.

A commit never waits on Redis: it hands its entries and wake-up here (or writes them itself,
:mod:`.commit_write`), and this thread sends everything handed over since its last round trip,
one round trip per publisher (each App has its own Redis and namespace). While one is
outstanding at most ``BACKLOG_LIMIT`` entries wait; past it a commit's entries are left to the
dispatchers, which publish every outbox row whatever happens here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import ResponseError

from .transport.messages import OutgoingMessage

__all__ = ["BACKLOG_LIMIT", "SENDER", "Publishing", "round_trip"]

logger = logging.getLogger(__name__)

#: Entries waiting for the sender thread at most; past it a commit's entries are not queued.
BACKLOG_LIMIT = 10_000


class Publishing(Protocol):
    """What the sender sends for: one round trip of entries and a wake-up."""

    def send(self, messages: Sequence[OutgoingMessage], *, wake: bool) -> None: ...


@dataclass(slots=True)
class _Waiting:
    """What one publisher's next round trip carries."""

    messages: list[OutgoingMessage] = field(default_factory=list)
    wake: bool = False


class _Sender:
    """The thread, started at the first hand-over (and anew in a forked child)."""

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """A fresh start, also in a forked child: the parent's thread does not exist there, and
        a lock another thread held at the fork stays held in the child."""
        self._cond = threading.Condition()
        self._owed: dict[Publishing, _Waiting] = {}
        self._waiting = 0
        self._handed = self._sent = 0  # puts so far; puts whose round trip is over
        self._thread: threading.Thread | None = None
        self._warned = False

    def put(self, publisher: Publishing, messages: Sequence[OutgoingMessage], *, wake: bool) -> None:
        """Hand ``messages`` (and a wake-up) to the thread; never blocks on Redis."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="durable_tasks-commit-publish", daemon=True)
                self._thread.start()
            owed = self._owed.setdefault(publisher, _Waiting())
            if self._waiting + len(messages) <= BACKLOG_LIMIT:
                owed.messages.extend(messages)
                self._waiting += len(messages)
            elif not self._warned:
                self._warned = True
                logger.warning(
                    "over %d entries wait to be published at commit (Redis slow or down): "
                    "the dispatchers publish the rest",
                    BACKLOG_LIMIT,
                )
            owed.wake = owed.wake or wake
            self._handed += 1
            self._cond.notify_all()  # the thread, not only a flush() waiting on the same condition

    def flush(self, timeout: float) -> bool:
        """Wait until what was handed over before this call has been sent (or failed)."""
        with self._cond:
            handed = self._handed
            return self._cond.wait_for(lambda: self._sent >= handed, timeout)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._owed:
                    cond.wait()
                owed, self._owed, self._waiting = self._owed, {}, 0
                handed = self._handed
            for publisher, entry in owed.items():
                try:
                    publisher.send(entry.messages, wake=entry.wake)
                except Exception:  # never end the thread: the next commits' entries still go
                    logger.exception("publishing at commit failed (the dispatchers publish and poll)")
            with cond:
                self._sent = handed
                cond.notify_all()


#: The process's sender.
SENDER = _Sender()


def round_trip(conn: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write on a redis-py connection and read their replies (an error
    reply as its exception); a connection that failed midway is dropped (the next round trip
    connects anew)."""
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        conn.disconnect()
        raise
