"""Children of a benchmark that die with it.

A benchmark stopped in a way its ``finally`` never sees (SIGKILL, a timeout that kills the
parent alone, a closed terminal) left its workers and dispatchers running: they went on
draining their namespace and took the cores from the next measurement. Every process a
benchmark starts is started with ``preexec_fn=die_with_parent()``: Linux SIGKILLs it when the
thread that started it exits (``PR_SET_PDEATHSIG``). Elsewhere it is ``None`` (no such call).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child is killed when its parent dies.

    SIGKILL rather than a signal the child could handle: the parent that would have read its
    results is gone, and a child slow to stop is the one that would skew the next run. A parent
    that died before the child asked is caught by comparing the parent pid (the child exits).
    """
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec
