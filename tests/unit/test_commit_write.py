"""DirectWriter on one end of a socket pair, the test playing Redis on the other: writes never
block, replies are matched to writes, and a write that cannot go hands back everything unanswered."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import hiredis
import pytest

from durable_tasks.commit_write import DirectWriter


class Connection:
    """What the writer needs of a redis-py connection: its socket, and a disconnect."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.disconnected = False

    def disconnect(self) -> None:
        self.disconnected = True
        self._sock.close()


@pytest.fixture
def pair() -> Iterator[tuple[DirectWriter[str], Connection, socket.socket]]:
    ours, server = socket.socketpair()
    writer: DirectWriter[str] = DirectWriter()
    conn = Connection(ours)
    assert writer.adopt(conn)
    yield writer, conn, server
    server.close()
    ours.close()


def test_replies_are_matched_to_their_writes(pair: tuple[DirectWriter[str], Connection, socket.socket]) -> None:
    writer, _, server = pair
    assert writer.write([("PUBLISH", "c", "1"), ("PUBLISH", "c", "2")], "a") == []
    assert writer.write([("PUBLISH", "c", "3")], "b") == []
    assert server.recv(4096).count(b"PUBLISH") == 3
    assert writer.flush(0.05) == (False, [])  # no reply yet: it gives up, the writes still owed
    server.sendall(b":1\r\n:1\r\n:1\r\n")
    assert writer.flush(5) == (True, [])
    assert writer.ready


def test_an_error_reply_hands_back_its_write_and_every_later_one(
    pair: tuple[DirectWriter[str], Connection, socket.socket],
) -> None:
    writer, conn, server = pair
    for owed in ("a", "b", "c"):
        assert writer.write([("EVALSHA", "sha", 0)], owed) == []
    server.sendall(b":1\r\n-NOSCRIPT No matching script\r\n")  # a answered, b refused, c unanswered
    assert writer.flush(5) == (True, ["b", "c"])
    assert conn.disconnected
    assert not writer.ready
    assert writer.write([("PUBLISH", "c", "1")], "d") == ["d"]  # closed: the sender's to send


def test_an_error_found_by_the_next_write_hands_back_that_write_too(
    pair: tuple[DirectWriter[str], Connection, socket.socket],
) -> None:
    writer, conn, server = pair
    assert writer.write([("EVALSHA", "sha", 0)], "a") == []
    server.sendall(b"-NOSCRIPT No matching script\r\n")
    assert select.select([conn._sock], [], [], 5)[0]  # the reply is there to read
    assert writer.write([("PUBLISH", "c", "1")], "b") == ["a", "b"]
    assert conn.disconnected


def test_a_server_that_stops_reading_never_blocks_a_write(
    pair: tuple[DirectWriter[str], Connection, socket.socket],
) -> None:
    """The socket's buffer fills (the server reads nothing): the write that does not fit
    closes the connection and hands back every unanswered write, its own last."""
    writer, conn, server = pair
    big = "x" * 65536
    written: list[str] = []
    for n in range(1000):
        left = writer.write([("PUBLISH", "c", big)], str(n))
        if left:
            assert left == [*written, str(n)]
            break
        written.append(str(n))
    else:
        pytest.fail("64 MB went into a socket nobody reads")
    assert conn.disconnected
    assert not writer.ready
    # What reached the server is whole commands, then at most the start of one: no write
    # went in after a part of another.
    reader, commands = hiredis.Reader(), 0
    server.settimeout(5)
    while chunk := server.recv(1 << 20):
        reader.feed(chunk)
        while (command := reader.gets()) is not False:
            assert command == [b"PUBLISH", b"c", big.encode()]
            commands += 1
    assert commands in {len(written), len(written) + 1}


def test_a_closed_connection_is_found_by_the_next_write(
    pair: tuple[DirectWriter[str], Connection, socket.socket],
) -> None:
    writer, conn, server = pair
    assert writer.write([("PUBLISH", "c", "1")], "a") == []
    server.close()
    assert writer.write([("PUBLISH", "c", "2")], "b") == ["a", "b"]
    assert conn.disconnected


def test_one_connection_at_a_time(pair: tuple[DirectWriter[str], Connection, socket.socket]) -> None:
    writer, _, _ = pair
    other, peer = socket.socketpair()
    try:
        assert not writer.adopt(Connection(other))  # the sender keeps it as its own
        assert not DirectWriter().adopt(object())  # no socket: nothing to take over
    finally:
        other.close()
        peer.close()
