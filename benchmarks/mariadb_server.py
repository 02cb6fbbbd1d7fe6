"""Run one command against a private MariaDB: for a measurement that needs a server setting the
shared test server must keep (its buffer pool's size, say).

    python -m benchmarks.mariadb_server [--buffer-pool 2G] [--option innodb_x=y]... -- CMD...

Starts ``mariadbd`` on a free loopback port with a fresh data directory (MariaDB's defaults, as
the Debian package configures them: utf8mb4, no name resolution), runs CMD with
``DT_BENCH_DATABASE_URL`` pointing at its ``test`` database, then stops the server by its pid and
deletes the directory. CMD's exit status is this command's. Example, the retention case of
docs/performance.md over ids spread across the key, with a buffer pool that holds the indexes::

    python -m benchmarks.mariadb_server --buffer-pool 2G -- python -m benchmarks.bench_scale \\
        --cases retention --scale 0.1 --n 20000 --history-ids random
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from benchmarks.run import free_port
from durable_tasks.valkey_keeper import die_with_parent

#: How long the server may take to accept connections (its data directory is new).
START_TIMEOUT = 60.0


@contextmanager
def private_mariadb(buffer_pool: str, options: Sequence[str] = ()) -> Iterator[str]:
    """A MariaDB server of our own for the block: yields its SQLAlchemy URL."""
    server = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    install = shutil.which("mariadb-install-db")
    if not Path(server).exists() or install is None:
        raise SystemExit("mariadbd and mariadb-install-db not found: install the mariadb-server package")
    home = Path(tempfile.mkdtemp(prefix="dt-bench-mariadb-"))
    data, port, user = home / "data", free_port(), getpass.getuser()  # the server runs as this user
    log = open(home / "server.log", "w")  # noqa: SIM115 - closed below
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [install, "--no-defaults", f"--datadir={data}", f"--user={user}",
             "--auth-root-authentication-method=normal"],
            check=True, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        proc = subprocess.Popen(
            [server, "--no-defaults", f"--datadir={data}", f"--user={user}", "--bind-address=127.0.0.1",
             f"--port={port}", f"--socket={home / 'sock'}", f"--pid-file={home / 'pid'}", "--skip-name-resolve",
             "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
             f"--innodb-buffer-pool-size={buffer_pool}", *(f"--{o}" for o in options)],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGKILL),
        )  # fmt: skip
        url = f"mysql+pymysql://root@127.0.0.1:{port}/test"
        _wait_ready(url, proc)
        yield url
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the server at ``url`` answers a query; it exiting first is an error."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 1})
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"mariadbd exited with status {proc.returncode} before it accepted connections")
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"mariadbd did not accept connections within {START_TIMEOUT:.0f} s") from None
                time.sleep(0.2)
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buffer-pool", default="128M", help="innodb_buffer_pool_size (MariaDB's default: 128M)")
    ap.add_argument("--option", action="append", default=[], help="another server option, name=value")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the command to run after --")
    # A SIGTERM (timeout, a stopped job) ends the block, so the server stops and its data goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with private_mariadb(a.buffer_pool, a.option) as url:
        print(f"private MariaDB at {url}, innodb_buffer_pool_size={a.buffer_pool}", flush=True)
        return subprocess.run(command, env={**os.environ, "DT_BENCH_DATABASE_URL": url}).returncode


if __name__ == "__main__":
    sys.exit(main())
