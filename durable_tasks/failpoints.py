"""Named failpoints for fault-injection tests: off unless enabled, nearly free when off.

Enable them from a test (:func:`enable`), or in a process a test starts: its program calls
:func:`enable_from_environment`, which reads ``DT_FAILPOINTS``
(``"worker.after_run=crash;dispatch.after_xadd=raise*2"``). Actions:

- ``crash``: SIGKILL this process (no cleanup, no finally blocks: a real crash);
- ``raise``: raise :class:`FailpointError`;
- ``pause:<seconds>``: block the whole process (a GC pause, a stopped VM), then go on.

``*N`` after an action fires it only on the first N hits. Call sites read ``ENABLED`` first,
so a disabled failpoint costs one global lookup.

Points: ``dispatch.after_claim``, ``dispatch.after_xadd`` (published, not yet marked SENT),
``worker.after_claim`` (fenced, not yet run), ``worker.after_run`` (ran, result not yet
committed), ``worker.after_commit`` (committed, not yet acknowledged),
``reaper.after_reclaim`` (new delivery written, old entry not yet acknowledged),
``journal.after_step`` (a step recorded, e.g. a model response, before the handler goes on),
``journal.after_suspend`` (children submitted and the task WAITING, entry not yet acknowledged).

The guard: the library never reads ``DT_FAILPOINTS`` by itself. A variable exported in a shell,
an image or a supervisor's environment (inherited by every process started there) arms nothing
unless the program that runs also calls :func:`enable_from_environment`; the test apps that the
chaos and kill-and-resume tests start do, an application does not. Importing this module with
``DT_FAILPOINTS`` set logs a warning that it is ignored.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

__all__ = [
    "ENABLED",
    "ENVIRONMENT_VARIABLE",
    "POINTS",
    "FailpointError",
    "disable_all",
    "enable",
    "enable_from_environment",
    "hit",
]

logger = logging.getLogger(__name__)

#: What :func:`enable_from_environment` reads.
ENVIRONMENT_VARIABLE = "DT_FAILPOINTS"

POINTS = frozenset(
    {
        "dispatch.after_claim",
        "dispatch.after_xadd",
        "worker.after_claim",
        "worker.after_run",
        "worker.after_commit",
        "reaper.after_reclaim",
        "journal.after_step",
        "journal.after_suspend",
    }
)


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


@dataclass(slots=True)
class _Action:
    kind: str
    seconds: float = 0.0
    remaining: int | None = None


_actions: dict[str, _Action] = {}
_lock = threading.Lock()
ENABLED = False


def _parse(spec: str) -> _Action:
    spec, _, times = spec.partition("*")
    kind, _, arg = spec.partition(":")
    if kind not in ("crash", "raise", "pause"):
        raise ValueError(f"unknown failpoint action {kind!r}: use crash, raise or pause:<seconds>")
    return _Action(kind, float(arg or 0), int(times) if times else None)


def enable(name: str, action: str) -> None:
    """Arm failpoint ``name`` with ``action`` (see the module docstring)."""
    global ENABLED
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {sorted(POINTS)}")
    with _lock:
        _actions[name] = _parse(action)
        ENABLED = True


def disable_all() -> None:
    """Disarm every failpoint."""
    global ENABLED
    with _lock:
        _actions.clear()
        ENABLED = False


def hit(name: str) -> None:
    """Pass failpoint ``name``: act if it is armed."""
    with _lock:
        action = _actions.get(name)
        if action is None:
            return
        if action.remaining is not None:
            if action.remaining <= 0:
                return
            action.remaining -= 1
    if action.kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.kind == "raise":
        raise FailpointError(f"failpoint {name} fired")
    else:
        time.sleep(action.seconds)


def enable_from_environment() -> list[str]:
    """Arm the failpoints ``DT_FAILPOINTS`` names (``point=action;point=action``); returns the
    points armed. Only test programs call this (see the guard in the module docstring)."""
    armed = []
    for item in filter(None, os.environ.get(ENVIRONMENT_VARIABLE, "").split(";")):
        name, _, spec = item.partition("=")
        enable(name.strip(), spec.strip())
        armed.append(name.strip())
    return armed


if os.environ.get(ENVIRONMENT_VARIABLE):
    logger.warning(
        "%s is set but ignored: failpoints are armed only by a test program that calls "
        "durable_tasks.failpoints.enable_from_environment()",
        ENVIRONMENT_VARIABLE,
    )
