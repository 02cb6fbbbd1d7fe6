"""A commit's write of what it owes Redis on its own thread, once the sender has a connection
up (:mod:`.commit_publish`).

Through the sender thread a one-task submit pays hops: a wake-up of that thread, the
interpreter lock handed to it and back, and a second wake-up for Redis' reply. On two busy
cores those hops cost the submitting process more than the round trip itself (``python -m
benchmarks.bench_dt submit``; figures in docs/performance.md). So once the sender thread has
connected to a single Redis node and a round trip on that connection succeeded (the server
holds the enqueue script), the connection is handed here: a commit packs its calls and writes
them to the socket without blocking, on the committing thread, after reading, without
blocking, the replies of earlier writes. A commit still never waits on Redis: a write that
does not fit in the socket's buffer, a connection found closed, an error reply (a server that
lost the script) close the connection, and what every write not yet answered owed goes back
to the sender thread with the commit's own, which connects again and sends it once more (the
enqueue script's dedup key makes a second send of an entry return the first's id). Only a
plain TCP or Unix socket is taken over: TLS has no write that never blocks.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import hiredis

__all__ = ["DirectWriter"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Bytes read from the socket per call while draining replies.
_CHUNK = 65536


class _ErrorReply(Exception):
    """An earlier write's command failed at the server."""


class DirectWriter(Generic[T]):
    """One connection written by committing threads (one at a time), its replies read at the
    next write or at :meth:`flush`. Each write carries what it owes (a ``T``): handed back
    when its replies do not all come back as they should."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Any = None  # the redis-py Connection: its socket is ours; it closes it
        self._sock: socket.socket | None = None
        self._pid = 0
        self._reader = hiredis.Reader()
        self._unanswered: deque[list[Any]] = deque()  # per write: [replies still due, what it owes]

    def adopt(self, conn: Any) -> bool:
        """Take over ``conn``, a connected redis-py connection whose replies have all been
        read: False (left as it is) if its socket is not a plain one, or one is held already."""
        sock = getattr(conn, "_sock", None)  # redis-py keeps the socket there, unexported
        if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
            return False
        if self._pid != os.getpid():  # new, or forked: a lock held at the fork stays held here
            self._lock, self._conn, self._sock, self._unanswered = threading.Lock(), None, None, deque()
        with self._lock:
            if self._sock is not None:
                return False
            sock.setblocking(False)
            self._conn, self._sock, self._pid, self._reader = conn, sock, os.getpid(), hiredis.Reader()
        return True

    @property
    def ready(self) -> bool:
        """Whether a connection is held, in this process (a forked child writes none)."""
        return self._sock is not None and self._pid == os.getpid()

    def write(self, commands: Sequence[tuple[Any, ...]], owed: T) -> list[T]:
        """Write ``commands`` without blocking. Returns what is left to send another way:
        nothing when written; else what every unanswered write owed and ``owed`` (the
        connection closed)."""
        data = b"".join(hiredis.pack_command(command) for command in commands)
        with self._lock:
            sock = self._sock
            if sock is None or self._pid != os.getpid():
                return [owed]
            try:
                self._read_replies(sock)
                if sock.send(data) != len(data):  # a part went: the rest would garble the stream
                    raise BlockingIOError("the socket's buffer is full")
            except (OSError, _ErrorReply) as exc:
                logger.debug("writing at commit failed (the sender thread connects again): %s", exc)
                return [*self._close(), owed]
            self._unanswered.append([len(commands), owed])
            return []

    def flush(self, timeout: float) -> tuple[bool, list[T]]:
        """Wait until every write so far has its replies: (False, []) if ``timeout`` seconds
        passed first; (True, what unanswered writes owed) if the connection failed."""
        deadline = time.monotonic() + timeout
        if not self.ready:
            return True, []
        with self._lock:
            while (sock := self._sock) is not None and self._unanswered:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, []
                try:
                    sock.settimeout(left)
                    try:
                        chunk = sock.recv(_CHUNK)
                    finally:
                        sock.setblocking(False)
                    if not chunk:
                        raise ConnectionResetError("closed by the server")
                    self._reader.feed(chunk)
                    self._take_replies()
                except TimeoutError:
                    return False, []
                except (OSError, _ErrorReply) as exc:
                    logger.debug("a write at commit failed (the sender thread sends it again): %s", exc)
                    return True, self._close()
            return True, []

    def _read_replies(self, sock: socket.socket) -> None:
        """Read what has arrived (one call, unless it filled a whole chunk): an error reply
        raises; a closed connection raises."""
        while True:
            try:
                chunk = sock.recv(_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                raise ConnectionResetError("closed by the server")
            self._reader.feed(chunk)
            if len(chunk) < _CHUNK:
                break
        self._take_replies()

    def _take_replies(self) -> None:
        while (reply := self._reader.gets()) is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise _ErrorReply(str(reply))
            head = self._unanswered[0]
            head[0] -= 1
            if head[0] == 0:
                self._unanswered.popleft()

    def _close(self) -> list[T]:
        """Close the connection; what the writes not yet answered owed."""
        conn, self._conn, self._sock = self._conn, None, None
        owed = [owed for _, owed in self._unanswered]
        self._unanswered.clear()
        if conn is not None and self._pid == os.getpid():
            conn.disconnect()
        return owed
