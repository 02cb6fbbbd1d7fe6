"""The keeper of an embedded Valkey: a small process that runs the server for a data directory
while some process uses it, restarts it if it dies, and stops it when none is left.

Every process that calls :func:`durable_tasks.embedded.ensure_valkey` is recorded as a *user*
in ``valkey.json``. The keeper looks at the users twice a second: a user that exited, however
(Ctrl-C, SIGTERM, SIGKILL, a crash), is dropped, and once none is left for ``--grace`` seconds
the keeper stops the server (SIGTERM: Valkey writes its AOF and exits) and then itself. If the
server dies while users remain, the keeper starts it again on the same socket and data (AOF on),
so the runtime's clients reconnect to the same streams instead of failing on every call (after
three restarts in a row that do not answer, it gives up and removes its state: the next start
then reports the server's log). On
Linux the server also gets SIGTERM if the keeper itself is killed, so no server outlives it.

The keeper runs as ``python <this file>``: it imports nothing of durable_tasks (stdlib only), so
it starts in milliseconds, and the helpers here serve :mod:`durable_tasks.embedded` too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

__all__ = [
    "State",
    "die_with_parent",
    "is_valkey",
    "locked",
    "pid_alive",
    "ping",
    "process_start",
    "read_state",
    "terminate",
    "wait_for_ping",
    "write_state",
]

logger = logging.getLogger("durable_tasks.embedded")

STATE_FILE = "valkey.json"
_POLL_S = 0.5
_STOP_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_MAX_FAILED_RESTARTS = 3


def process_start(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, from /proc), so a reused pid is told
    apart from the process that held it; None where there is no procfs."""
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    return None


def pid_alive(pid: int, started: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie), and is the process that started at ``started``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # exited; its parent has not reaped it yet
            return False
        return started is None or fields[19] == started
    return True


def is_valkey(pid: int) -> bool:
    """Whether ``pid`` is a valkey process (only those are ever signalled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False
        result = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
        cmdline = result.stdout  # no procfs (macOS): ask ps
    except OSError:
        return False
    return _is_server_title(cmdline)


def _is_server_title(cmdline: str) -> bool:
    """Whether a command line is a valkey server's (its program, not an argument, is
    valkey-server: the keeper's command line names the server's too)."""
    program = cmdline.split("\0", 1)[0].split(" ", 1)[0]
    return program.rsplit("/", 1)[-1].startswith("valkey-server")


def ping(sock_path: str, timeout: float = 1.0) -> bool:
    """Whether the server on the unix socket answers PING."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(sock_path)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def wait_for_ping(sock: str, timeout: float, is_running: Callable[[], bool]) -> bool:
    """Wait until the server answers PING (True), exits, or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if ping(sock):
            return True
        if not is_running() or time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def terminate(pid: int, child: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM ``pid`` (Valkey then writes its AOF), SIGKILL it if it outlives the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while (child.poll() is None) if child is not None else pid_alive(pid):
        if time.monotonic() >= deadline:
            logger.warning("valkey pid %d ignored SIGTERM; sending SIGKILL", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 1.0  # a successor must not share the AOF with it
            if not pid_alive(pid):
                break
        time.sleep(0.02)


@contextlib.contextmanager
def locked(data_dir: Path) -> Iterator[None]:
    """Hold the data directory's lock (one writer of ``valkey.json`` at a time)."""
    with open(data_dir / "valkey.lock", "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


@dataclass(slots=True)
class State:
    """``valkey.json``: the server, its keeper (the owner), its socket, and its users."""

    server_pid: int
    owner_pid: int
    socket: str
    users: dict[int, str | None] = field(default_factory=dict)  # pid -> process start

    def live_users(self) -> dict[int, str | None]:
        """The users still running."""
        return {pid: start for pid, start in self.users.items() if pid_alive(pid, start)}


def read_state(data_dir: Path) -> State | None:
    """The directory's state, or None (no server, or a file this version cannot read)."""
    try:
        raw = json.loads((data_dir / STATE_FILE).read_text())
        users = {int(pid): start for pid, start in dict(raw.get("users", {})).items()}
        return State(int(raw["server_pid"]), int(raw["owner_pid"]), str(raw["socket"]), users)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_state(data_dir: Path, state: State) -> None:
    """Replace ``valkey.json`` atomically (the caller holds the lock)."""
    tmp = data_dir / f"{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(
        json.dumps(
            {
                "server_pid": state.server_pid,
                "owner_pid": state.owner_pid,
                "socket": state.socket,
                "users": {str(pid): start for pid, start in state.users.items()},
            }
        )
    )
    os.replace(tmp, data_dir / STATE_FILE)


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: Linux sends the child ``sig`` when the thread
    that started it exits (``PR_SET_PDEATHSIG``), and a child whose parent died before it asked
    exits at once; None elsewhere (no such call). The server here gets SIGTERM (it writes its
    AOF); the benchmarks' children SIGKILL (nobody is left to read them)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def start_server(argv: list[str]) -> subprocess.Popen[bytes]:
    """Start valkey with ``argv``; on Linux it is SIGTERMed if this process dies."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent(signal.SIGTERM),  # prctl only: safe between fork and exec
    )


def _running(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is None


def keep(data_dir: Path, argv: list[str], sock: str, *, grace: float, timeout: float) -> int:
    """Run the server until no user is left (see the module docstring); returns an exit code."""
    server = start_server(argv)
    print(server.pid, flush=True)  # the starting process waits for this line and the PING
    idle_since: float | None = None
    failed_restarts = 0
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=_POLL_S)
        with locked(data_dir):
            state = read_state(data_dir)
            if state is None or state.owner_pid != os.getpid():  # stopped or replaced by someone else
                terminate(server.pid, server)
                return 0
            users = state.live_users()
            if not users:
                idle_since = idle_since if idle_since is not None else time.monotonic()
                if time.monotonic() - idle_since >= grace:
                    logger.info("no process uses valkey pid %d any more: stopping it", server.pid)
                    terminate(server.pid, server)
                    (data_dir / STATE_FILE).unlink(missing_ok=True)
                    return 0
            else:
                idle_since = None
            if server.poll() is not None:
                logger.warning("valkey pid %d exited with %s; restarting it", server.pid, server.returncode)
                with contextlib.suppress(OSError):
                    Path(sock).unlink(missing_ok=True)
                server = start_server(argv)
                if wait_for_ping(sock, timeout, partial(_running, server)):
                    failed_restarts = 0
                else:
                    failed_restarts += 1
                    logger.error("valkey did not restart; see %s", data_dir / "valkey.log")
                if failed_restarts >= _MAX_FAILED_RESTARTS:  # the users' next start reports the log
                    logger.error("giving up after %d failed restarts", failed_restarts)
                    terminate(server.pid, server)
                    (data_dir / STATE_FILE).unlink(missing_ok=True)
                    return 1
            if users != state.users or server.pid != state.server_pid:
                write_state(data_dir, State(server.pid, state.owner_pid, state.socket, users))


def main(args: list[str] | None = None) -> int:
    """``python valkey_keeper.py DATA_DIR SOCKET [--grace S] -- VALKEY_ARGV...``"""
    args = sys.argv[1:] if args is None else args
    split = args.index("--") if "--" in args else len(args)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("socket")
    parser.add_argument("--grace", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=10.0)
    ns = parser.parse_args(args[:split])
    argv = args[split + 1 :]
    logging.basicConfig(
        filename=ns.data_dir / "keeper.log", level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the users
    return keep(ns.data_dir, argv, ns.socket, grace=ns.grace, timeout=ns.timeout)


if __name__ == "__main__":
    sys.exit(main())
