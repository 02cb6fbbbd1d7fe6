"""Create one virtual environment per peer under .bench/venvs/<peer> with the pinned versions.

    python -m benchmarks.peers.install [--peers all|name,...] [--force]

Each peer has its own venv so their redis/psycopg/anyio pins cannot clash with each other or
with durable_tasks. A venv is (re)built when its stamp file does not match the pinned spec.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".bench" / "venvs"
STAMP = ".dtbench-installed"

#: peer -> pip requirements (pinned to the versions of the issue's measurement)
PINS: dict[str, list[str]] = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg", "psycopg[binary]"],
    "taskiq": ["taskiq==0.13.0", "taskiq-redis==1.2.4"],
    "dramatiq": ["dramatiq[redis]==2.2.1"],
    "saq": ["saq[redis]==0.26.4", "typing_extensions"],  # saq imports typing_extensions without requiring it
    "dbos": ["dbos==3.4.0", "psycopg[binary]"],
    "celery": ["celery[redis]==5.7.0"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]"],
    "arq": ["arq==0.28.0"],
}
PEERS = list(PINS)


def venv_python(peer: str) -> Path:
    return VENVS / peer / "bin" / "python"


def installed(peer: str) -> bool:
    stamp = VENVS / peer / STAMP
    return venv_python(peer).exists() and stamp.exists() and stamp.read_text() == " ".join(PINS[peer])


def install(peer: str, force: bool = False, log: TextIO = sys.stderr) -> str | None:
    """Build the peer's venv; None on success, else the reason it failed (last lines of pip's output)."""
    if installed(peer) and not force:
        return None
    where = VENVS / peer
    if where.exists():
        shutil.rmtree(where)
    VENVS.mkdir(parents=True, exist_ok=True)
    (ROOT / ".bench" / ".gitignore").write_text("*\n")  # the whole .bench/ tree stays out of git
    steps = [
        [sys.executable, "-m", "venv", str(where)],
        [str(venv_python(peer)), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(venv_python(peer)), "-m", "pip", "install", "--quiet", *PINS[peer]],
    ]
    for cmd in steps:
        print(f"[install {peer}] {' '.join(cmd[-3:])}", file=log, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
            return " | ".join(lines[-4:]) or f"exit code {done.returncode}"
    (where / STAMP).write_text(" ".join(PINS[peer]))
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default="all")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    peers = PEERS if a.peers == "all" else a.peers.split(",")
    failed = {}
    for peer in peers:
        why = install(peer, force=a.force)
        print(f"{peer}: {'ok' if why is None else 'FAILED: ' + why}", flush=True)
        if why:
            failed[peer] = why
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
