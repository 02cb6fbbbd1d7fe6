"""CPU time of this machine and of its local servers, read from /proc: what a benchmark run
cost the PostgreSQL, MariaDB/MySQL and Redis processes it talks to, beside its own process's CPU."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator

__all__ = ["DATABASES", "database_cpu_since", "machine_busy", "server_cpu", "server_cpu_since", "session_cpu"]

#: The names of the database servers' processes (postgres: one per connection and helper).
DATABASES = ("postgres", "mariadbd", "mysqld")


def _role(pid: str, server: str) -> str:
    """A postgres process's role from its title ("backend", "walwriter", "autovacuum", ...)."""
    if server != "postgres":
        return ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().decode(errors="replace").replace("\0", " ").strip()
    except OSError:
        return "?"
    if not title.startswith("postgres: "):
        return "postmaster"
    rest = title.removeprefix("postgres: ")
    if rest.split()[0].endswith(":"):  # cluster_name
        rest = rest.split(None, 1)[1]
    if "(" in rest:
        return "backend"
    return rest.split()[0]


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _processes() -> Iterator[tuple[str, str, int, float]]:
    """Every live process: (pid, name, session id, CPU seconds used so far, user + system)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # from the state on: the name may hold spaces
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        yield pid, name, int(fields[3]), (int(fields[11]) + int(fields[12])) / ticks


def server_cpu() -> dict[tuple[str, str], float]:
    """CPU seconds (user + system) used so far by every local database (:data:`DATABASES`) and
    redis/valkey process, by (role, pid)."""
    used: dict[tuple[str, str], float] = {}
    for pid, name, _session, seconds in _processes():
        for server in (*DATABASES, "redis", "valkey"):
            if name.startswith(server):
                used[(f"{server} {_role(pid, server)}".strip(), pid)] = seconds
    return used


def session_cpu(sid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of session ``sid``: a
    worker started in a session of its own and every process it started (a child that exited
    is left out)."""
    return sum(seconds for _pid, _name, session, seconds in _processes() if session == sid)


def server_cpu_since(before: dict[tuple[str, str], float]) -> dict[str, float]:
    """CPU seconds each role used since ``before``, summed over the processes alive now (a
    process that exited meanwhile, e.g. a connection of an earlier event loop, is left out
    rather than subtracted)."""
    used: dict[str, float] = defaultdict(float)
    for (role, pid), seconds in server_cpu().items():
        used[role] += seconds - before.get((role, pid), 0.0)
    return used


def database_cpu_since(before: dict[tuple[str, str], float]) -> float:
    """CPU seconds the local database servers' processes used since ``before`` (0 for SQLite,
    which runs in the benchmark's own process, or a server on another machine)."""
    return sum(v for role, v in server_cpu_since(before).items() if role.startswith(DATABASES))
