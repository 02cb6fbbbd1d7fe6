"""What the runtime changes in a process it owns: the garbage collector.

The CLI's ``run``, ``worker``, ``dispatcher`` and ``reaper`` call :func:`tune_gc` before they
start (the benchmark's child processes stand for them and do the same). An application that
runs ``App.run()`` inside a process of its own decides for itself; it may call it too.

Why: a worker keeps up to ``concurrency`` attempts in flight, each holding coroutines, futures
and frames until its group commit returns. With Python's defaults (a young collection every
700 net allocations) many of them are still alive at each young collection, move on to the
older generations, and soon trigger a full collection, which also walks the ~100,000 objects
that importing SQLAlchemy, pydantic, OpenTelemetry and the application left: in the
in-process drain, 7 full collections per 20,000 tasks of 41-57 ms each, 15 % of the drain's
time and each a stall for every task in flight. Freezing those startup objects (``gc.freeze``:
no collection walks them again) made a full collection take ~3 ms; a young threshold of 5,000
let most in-flight objects die before a collection (collections 0.5-0.7 ms each, ~60 ms of
collector time per 20,000 tasks against ~170 ms at 700). docs/performance-design.md has the
effect on the drain.
"""

from __future__ import annotations

import gc

from .settings import Settings

__all__ = ["tune_gc"]


def tune_gc(settings: Settings) -> None:
    """Freeze what startup left and set the young generation's threshold to
    ``settings.gc_young_threshold`` (the older generations keep theirs); 0 changes nothing."""
    threshold = settings.gc_young_threshold
    if not threshold:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
