"""The chaos runs' MySQL/MariaDB: a borrowed server (``DT_TEST_MYSQL_URL``, default the
machine's MariaDB), one fresh database per scenario, dropped after.

MySQL has no ``application_name``: the harness tells a process's connections by their client
ports, read from ``/proc/<pid>`` (the process's sockets) and matched with the ``HOST`` column of
``information_schema.PROCESSLIST`` (``127.0.0.1:<port>``). Linux only, as the harness is.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from tests.helpers import innodb_trx_turn

__all__ = ["DEFAULT_URL", "MySql", "connection_ids", "open_transactions"]

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/test"


class MySql:
    """The database server of a chaos run on MySQL/MariaDB: one database per scenario."""

    def __init__(self, base_url: str) -> None:
        self.url = sa.engine.make_url(base_url)
        self._admin = sa.create_engine(self.url, pool_pre_ping=True, connect_args={"connect_timeout": 3})
        self._databases: list[str] = []

    @classmethod
    def start(cls, directory: Path | None = None) -> MySql:
        """The server of ``DT_TEST_MYSQL_URL`` (default :data:`DEFAULT_URL`); raises
        ``DBAPIError`` when none answers."""
        mysql = cls(os.environ.get("DT_TEST_MYSQL_URL") or DEFAULT_URL)
        with mysql._admin.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return mysql

    @property
    def restartable(self) -> bool:
        """A borrowed server is never crash-restarted by the harness."""
        return False

    def restart(self) -> float:
        """Not possible: the server is borrowed."""
        raise RuntimeError("the chaos harness borrows its MySQL server: it cannot crash-restart it")

    def create_schema(self, prefix: str = "chaos") -> str:
        """A fresh database; returns its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with self._admin.begin() as conn:
            conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        self._databases.append(name)
        return self.url.set(database=name).render_as_string(hide_password=False)

    def drop_schema(self, url: str) -> None:
        """Drop the database behind ``url`` (created by :meth:`create_schema`)."""
        name = sa.engine.make_url(url).database
        if name in self._databases:
            with contextlib.suppress(DBAPIError), self._admin.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{name}`"))
            self._databases.remove(name)

    def close(self) -> None:
        """Drop the databases left."""
        for name in list(self._databases):
            with contextlib.suppress(DBAPIError), self._admin.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{name}`"))
        self._databases.clear()
        self._admin.dispose()


def _client_ports(pid: int, server_port: int) -> set[int]:
    """The local ports of ``pid``'s TCP connections to ``server_port``."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def connection_ids(conn: sa.Connection, pid: int) -> list[int]:
    """The server's ids of the connections process ``pid`` holds."""
    port = sa.engine.make_url(str(conn.engine.url)).port or 3306
    ports = _client_ports(pid, port)
    if not ports:
        return []
    rows = conn.execute(sa.text("SELECT ID, HOST FROM information_schema.PROCESSLIST")).all()
    return [
        int(r.ID)
        for r in rows
        if r.HOST and r.HOST.rsplit(":", 1)[-1].isdigit() and int(r.HOST.rsplit(":", 1)[1]) in ports
    ]


def open_transactions(conn: sa.Connection, pid: int) -> int:
    """Connections of ``pid`` running a statement or holding an InnoDB transaction."""
    ids = connection_ids(conn, pid)
    if not ids:
        return 0
    with innodb_trx_turn():
        busy = conn.execute(
            sa.text(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST AS p WHERE p.ID IN :ids AND (p.COMMAND <> 'Sleep' "
                "OR EXISTS (SELECT 1 FROM information_schema.INNODB_TRX AS t WHERE t.trx_mysql_thread_id = p.ID))"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": ids},
        ).scalar_one()
    return int(busy)
