"""What a committed submit owes Redis: its tasks' stream entries, and the dispatchers' wake-up.

The dispatcher is the durable path from the outbox to the streams: its lease and its mark make
every row reach its stream whatever crashes. On that path alone a task waits, after its submit
commits, for a dispatcher to wake, lease the row in a statement of its own and publish it;
that hop was a third of submit→start at 200 tasks/s. So the submitting process also publishes
the first delivery of each task it just created, once its transaction commits (never before:
a worker must find the task row), through the same enqueue script with the same dedup key,
stream and fields as the dispatcher (:mod:`.transport.enqueue`). The dispatcher's publish of
the row then adds nothing and gets the same entry id back, which it records as always. A
publish here that fails, times out or never happens (the process dies after its commit) costs
latency only: the dispatcher publishes.

The commit does not wait for Redis. One daemon thread per process (:mod:`.commit_sender`)
connects and sends everything handed to it since its last round trip in one write per App, on a
connection of its own; a Redis that is down or slow delays nothing but these entries (each
round trip gives up after 0.25 s), and while one is outstanding at most
``commit_sender.BACKLOG_LIMIT`` entries wait, the rest are left to the dispatcher. Once a
round trip on its connection has succeeded, the sender hands that connection to the
committing threads (:mod:`.commit_write`): a commit then writes its calls itself, without
blocking and without waiting for the reply, which saves the thread's wake-ups (about half of
what a one-task submit's publish costs), and hands anything that fails back to the sender.
Entries still waiting when the process exits are the dispatcher's.

Only what the dispatcher would publish at once goes: a task that is due (not delayed), not a
shadow, on a queue this process does not hold paused, in a process that talks to Redis (not
a runtime substituted onto an in-memory transport). On a Redis Cluster a submit sends only the
wake-up. A worker does the same, on its event loop's own client, for the deliveries its own
commits create: a suspension's children, and the resume of a parent whose last child's result
(or final failure) it committed (:meth:`.runtime.Runtime.publish_committed`).

The wake-up: PostgreSQL's submits NOTIFY the dispatchers' LISTEN at commit. MySQL/MariaDB and
SQLite have no such channel, so their dispatchers poll the outbox every ``poll_interval``; a
committed submit ends that wait with one ``PUBLISH`` on the namespace's wake channel
(:class:`.wakeup.RedisWakeWaiter`), in the same round trip as the entries. On the embedded
default (no Redis URL) both go to the data directory's Valkey once its socket exists; a
process never starts that server to publish (where it does not run, no worker does either).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa
from redis.exceptions import NoScriptError, RedisClusterException
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from .commit_sender import SENDER, round_trip
from .commit_write import DirectWriter
from .embedded import valkey_socket
from .settings import Settings
from .transport.cluster_url import is_cluster_url, sync_cluster_client
from .transport.enqueue import enqueue_calls
from .transport.keys import wake_channel
from .transport.messages import OutgoingMessage
from .transport.scripts import Script

__all__ = ["CommitPublisher"]

logger = logging.getLogger(__name__)

#: A round trip that takes longer is given up (the dispatchers publish, and poll).
_TIMEOUT = 0.25
#: What a write on the committing thread owed: its entries and whether it woke the dispatchers.
_Owing = tuple[Sequence[OutgoingMessage], bool]


@dataclass(slots=True)
class _Owed:
    """What one (possibly nested) transaction owes Redis once the outermost commits."""

    messages: list[OutgoingMessage] = field(default_factory=list)
    wake: bool = False
    #: The connection the rows were written on: still in a transaction after the session's
    #: commit when the session only joined it (``Session(bind=connection)``).
    conn: sa.Connection | None = None


class CommitPublisher:
    """Publishes, once per committed transaction, its owed entries and wake-up (one per App)."""

    def __init__(self, settings: Settings, prioritized: Callable[[str], bool]) -> None:
        self._namespace = settings.namespace
        self._channel = wake_channel(settings.namespace)
        self._cluster = settings.redis_cluster
        self._redis_url = settings.redis_url
        #: The embedded default's server, used only while its socket exists: a process that
        #: only submits must not start a Valkey to publish.
        self._embedded: Path | None = None if settings.redis_url else valkey_socket(settings.data_dir)
        self._dedup_ttl_ms = int(settings.dedup_ttl.total_seconds() * 1000)
        key = settings.signing_key
        self._signing_key = key.get_secret_value().encode() if key else None
        self._prioritized = prioritized
        self._enqueue = Script("enqueue_batch")
        self._wakes = True
        self._lock = threading.Lock()
        # (pid, connection or cluster client): a forked child makes its own
        self._conn: tuple[int, Any] | None = None
        self._client: tuple[int, Any] | None = None
        #: The sender's connection once a round trip on it succeeded: commits write on it
        #: themselves (:mod:`.commit_write`).
        self._direct: DirectWriter[_Owing] = DirectWriter()
        #: False: every publish goes through the sender thread (to measure what writing saves).
        self.direct_writes = True

    def disable_wakeups(self) -> None:
        """Publish no wake-ups from now on (the dispatchers poll): for measuring what they save."""
        self._wakes = False

    def after_commit(self, session: Session, messages: Sequence[OutgoingMessage] = (), *, wake: bool) -> None:
        """Publish ``messages`` (and a wake-up) once ``session``'s transaction commits: not when
        it rolls back or closes uncommitted, nor what was written in a savepoint that rolled back."""
        wake = wake and self._wakes
        if not messages and not wake:
            return
        # Owed by the innermost transaction, the one whose rollback takes the rows away.
        marked = session.get_nested_transaction() or session.get_transaction()
        if marked is None:  # pragma: no cover - a submit's statements always begin one
            return
        _listen_to_sessions()
        owed_by: _OwedBy = session.info.setdefault(_OWED, {})
        entry = owed_by.setdefault(self, {}).setdefault(marked, _Owed())
        entry.messages.extend(messages)
        entry.wake = entry.wake or wake
        if messages:
            entry.conn = session.connection()  # the submit's statements began it: no new transaction

    def _committed(self, owed: dict[SessionTransaction, _Owed]) -> None:
        """The outermost transaction committed: hand what it owes to the sender."""
        # A session that joined an outer transaction (a hook's session on the fenced
        # transaction, a test's connection) "commits" a savepoint: its rows are not committed
        # yet, and a worker must not read entries for rows it cannot see (it would drop them as
        # stale). Those are the dispatcher's (a NOTIFY goes at the real commit).
        joined = any(entry.conn is not None and entry.conn.in_transaction() for entry in owed.values())
        messages = [] if joined else [m for entry in owed.values() for m in entry.messages]
        self._hand_over(messages, wake=any(entry.wake for entry in owed.values()))

    def publish(self) -> None:
        """A wake-up alone (the runtime's own outbox writes: a resume, a suspension's children)."""
        if self._wakes:
            self._hand_over((), wake=True)

    def _hand_over(self, messages: Sequence[OutgoingMessage], *, wake: bool) -> None:
        """Written here on the connection the sender handed over, or handed to the sender."""
        if not messages and not wake:
            return
        owing = (messages, wake)
        left = [owing]
        if self.direct_writes and self._direct.ready:
            try:
                left = self._direct.write(self._commands(messages, wake=wake), owing)
            except Exception:  # a commit never fails over its publish: the sender tries it
                logger.exception("writing at commit failed (the sender thread sends it)")
        self._to_sender(left)

    def _to_sender(self, owed: Sequence[_Owing]) -> None:
        """Hand ``owed`` to the sender thread."""
        if owed:
            SENDER.put(self, [m for messages, _ in owed for m in messages], wake=any(wake for _, wake in owed))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until what committed transactions handed over so far has been sent and
        answered (or failed): False if ``timeout`` seconds passed first. Nothing needs it for
        correctness; tests and benchmarks use it to order what they observe."""
        answered, owed = self._direct.flush(timeout)
        self._to_sender(owed)
        return answered and SENDER.flush(timeout)

    def send(self, messages: Sequence[OutgoingMessage], *, wake: bool) -> None:
        """One round trip (the sender thread's): the enqueue script for ``messages``,
        then the wake-up. A failure is logged and left to the dispatchers (a cluster client that
        finds no node raises RedisClusterException, which is no RedisError: caught too)."""
        url = self._redis_url
        if url is None:  # the embedded default: its server, if it runs
            assert self._embedded is not None
            if not self._embedded.exists():
                return
            url = f"unix://{self._embedded}"
        cluster = self._cluster or is_cluster_url(url)
        if cluster:
            messages = ()  # the entries' keys span slots: the dispatcher publishes them
        if not messages and not wake:
            return
        try:
            if cluster:
                self._cluster_client(url).publish(self._channel, "1")
            else:
                self._send(self._connection(url), messages, wake=wake)
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            logger.debug("publishing at commit failed (the dispatchers publish and poll): %s", exc)

    def _commands(self, messages: Sequence[OutgoingMessage], *, wake: bool) -> list[tuple[Any, ...]]:
        """The enqueue script's calls for ``messages``, then the wake-up."""
        calls = (
            enqueue_calls(
                messages,
                namespace=self._namespace,
                dedup_ttl_ms=self._dedup_ttl_ms,
                signing_key=self._signing_key,
                prioritized=self._prioritized,
            ).calls
            if messages
            else []
        )
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", self._enqueue.sha, len(keys), *keys, *args) for keys, args in calls
        ]
        if wake:
            commands.append(("PUBLISH", self._channel, "1"))
        return commands

    def _send(self, conn: Any, messages: Sequence[OutgoingMessage], *, wake: bool) -> None:
        """:meth:`_commands` in one write on the sender's own connection (no pool, no pipeline
        object: the sender's CPU competes with the committing threads for the interpreter); a
        script the server does not hold yet is loaded, and those calls sent once more. Once a
        round trip succeeded, the connection is the committing threads' to write on."""
        commands = self._commands(messages, wake=wake)
        replies = round_trip(conn, commands)
        script = [i for i, command in enumerate(commands) if command[0] == "EVALSHA"]
        missing = [commands[i] for i in script if isinstance(replies[i], NoScriptError)]
        if missing:  # the first publish on this server (or it restarted): load, then once more
            replies = round_trip(conn, [("SCRIPT", "LOAD", self._enqueue.source), *missing])[1:]
        failed = [reply for reply in replies if isinstance(reply, Exception)]
        for reply in failed:
            logger.debug("publishing at commit failed (the dispatchers publish and poll): %s", reply)
        if not failed:
            self._hand_to_committers(conn)

    def _hand_to_committers(self, conn: Any) -> None:
        """Give ``conn`` to :attr:`_direct` (the next round trip here connects anew)."""
        with self._lock:
            if self.direct_writes and self._conn is not None and self._conn[1] is conn and self._direct.adopt(conn):
                self._conn = None

    def _connection(self, url: str) -> Any:  # redis-py types a pool's connections partly
        """The sender's connection to a single Redis node: its own, outside any pool (only the
        sender thread uses it)."""
        with self._lock:
            if self._conn is None or self._conn[0] != os.getpid():
                client = redis.Redis.from_url(url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT)
                self._conn = (os.getpid(), client.connection_pool.make_connection())
            return self._conn[1]

    def _cluster_client(self, url: str) -> Any:
        """A client for a Redis Cluster (the wake-up goes through it)."""
        with self._lock:
            if self._client is None or self._client[0] != os.getpid():
                self._client = (
                    os.getpid(),
                    sync_cluster_client(url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT),
                )
            return self._client[1]


#: session.info key: what each publisher is owed once the session's outermost transaction commits.
_OWED = "durable_tasks.commit_publish"
_OwedBy = dict[CommitPublisher, dict[SessionTransaction, _Owed]]
_listening = False
_listening_lock = threading.Lock()


def _listen_to_sessions() -> None:
    """Listen once, on the Session class (every session, sqlmodel's too), rather than on each
    session that submits: three instance listeners cost a submit ~20 us to register, a class
    listener costs a session that owes nothing a dict lookup per transaction end."""
    global _listening
    if _listening:
        return
    with _listening_lock:
        if not _listening:
            event.listen(Session, "after_commit", _session_committed)
            event.listen(Session, "after_soft_rollback", _session_rolled_back)
            event.listen(Session, "after_transaction_end", _session_transaction_ended)
            _listening = True


def _session_committed(session: Session) -> None:
    if _OWED not in session.info:
        return
    root = session.get_transaction()
    if root is not None and root.is_active:  # a savepoint released: its rows await the outermost
        return
    owed_by: _OwedBy = session.info.pop(_OWED)
    for publisher, owed in owed_by.items():
        if owed:
            publisher._committed(owed)


def _session_rolled_back(session: Session, previous_transaction: SessionTransaction) -> None:
    owed_by: _OwedBy | None = session.info.get(_OWED)
    for owed in (owed_by or {}).values():
        for gone in [t for t in owed if _within(t, previous_transaction)]:
            del owed[gone]


def _session_transaction_ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost, committed (published) or not
        session.info.pop(_OWED, None)


def _within(transaction: SessionTransaction | None, outer: SessionTransaction) -> bool:
    """Whether ``transaction`` is ``outer`` or nested inside it."""
    while transaction is not None:
        if transaction is outer:
            return True
        transaction = transaction.parent
    return False
