"""A PgBouncer of the test's own, in front of the machine's PostgreSQL: a config written by the
test, a free loopback port, stopped by pid.

The pooler serves one database made for it (``CREATE DATABASE``): behind a transaction pooler
a client cannot keep a ``search_path`` of its own (that is session state), so the per-run
schema the other tests use has no equivalent here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import sqlalchemy as sa

from tests.servers import free_port

__all__ = ["MISSING", "PgBouncer", "pgbouncer", "pgbouncer_binary", "scratch_database"]

#: Why a test that needs PgBouncer skips when :func:`pgbouncer_binary` finds nothing.
MISSING = "pgbouncer is not installed (apt-get install -y pgbouncer; .ci/run installs it)"


def pgbouncer_binary() -> str | None:
    """Debian's pgbouncer, or None."""
    found = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    return found if Path(found).exists() else None


@dataclass(slots=True)
class PgBouncer:
    """A running PgBouncer this test owns."""

    port: int
    database: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the pooled database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    def admin(self, command: str) -> list[tuple[object, ...]]:
        """Run a command on PgBouncer's admin console (``SHOW POOLS``, ``SHOW VERSION``...)."""
        conninfo = f"host=127.0.0.1 port={self.port} dbname=pgbouncer user=postgres"
        with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
            return list(conn.execute(command.encode()).fetchall())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _config(home: Path, port: int, upstream: sa.URL, database: str, pool_mode: str, pool_size: int) -> Path:
    auth = home / "users.txt"
    auth.write_text(f'"{upstream.username or "postgres"}" ""\n')
    ini = home / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{database} = host={upstream.host or '127.0.0.1'} port={upstream.port or 5432} dbname={database}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {auth}\n"
        f"admin_users = {upstream.username or 'postgres'}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    for path in (home, auth, ini):  # PgBouncer refuses to run as root: it reads these as nobody
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ini


@contextmanager
def pgbouncer(
    binary: str, home: Path, upstream: sa.URL, database: str, *, pool_mode: str = "transaction", pool_size: int = 5
) -> Iterator[PgBouncer]:
    """PgBouncer on a free port serving ``database`` of ``upstream`` in ``pool_mode``."""
    port = free_port()
    ini = _config(home, port, upstream, database, pool_mode, pool_size)
    log = home / "pgbouncer.log"
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, *user, str(ini)], stdout=out, stderr=subprocess.STDOUT)
    bouncer = PgBouncer(port, database, proc, log)
    deadline = time.monotonic() + 15
    try:
        while True:
            try:
                bouncer.admin("SHOW VERSION")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.05)
        yield bouncer
    finally:
        bouncer.stop()


@contextmanager
def scratch_database(upstream: sa.URL) -> Iterator[str]:
    """A database made for one test module on ``upstream`` (dropped after, connections and all)."""
    name = f"dt_pgb_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(upstream, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
