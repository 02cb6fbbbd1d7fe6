"""The history log: every actor appends JSON lines (Jepsen-style invoke / ok / fail / info).

Each process writes its own file ``<actor>-<pid>.jsonl`` in one directory, one ``os.write``
per line on an ``O_APPEND`` descriptor, so threads of one process never interleave a line and
a SIGKILL loses at most the line being written. ``read_history`` merges every file of the
directory, ordered by wall-clock time.

Record fields: ``ts`` (wall clock, seconds), ``actor``, ``pid``, ``op`` (``submit``, ``rerun``,
``exec``), ``type`` (``invoke``, ``ok``, ``fail``, ``info``), and per op: ``key`` (idempotency
key), ``task_id``, ``generation``, ``attempt``, ``delivery``, ``poison``, ``detail``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["HistoryWriter", "read_history"]


class HistoryWriter:
    """Appends events of one actor to ``<dir>/<actor>-<pid>.jsonl``."""

    def __init__(self, directory: Path, actor: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.actor = actor
        self.pid = os.getpid()
        self.path = directory / f"{actor}-{self.pid}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, op: str, type_: str, **fields: Any) -> None:
        """Append one event (``type_`` is invoke, ok, fail or info)."""
        record = {"ts": time.time(), "actor": self.actor, "pid": self.pid, "op": op, "type": type_, **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        """Close the file (events already written stay)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_history(directory: Path) -> list[dict[str, Any]]:
    """Every event of every actor in ``directory``, oldest first; a torn last line is skipped."""
    events: list[dict[str, Any]] = []
    if not directory.exists():
        return events
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # the process died mid-line
            if isinstance(event, dict):
                events.append(event)
    events.sort(key=lambda e: float(e.get("ts", 0.0)))
    return events
