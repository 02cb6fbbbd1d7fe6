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

The middle generation is collected every :data:`MIDDLE_THRESHOLD` young collections instead of
Python's 10. With thousands of attempts in flight for a second each (an agent's tool calls), a
middle collection every ten young ones found most of them alive, promoted them to the oldest
generation, and that soon asked for full collections (160-245 ms each, stalling every task);
at 100, most have ended by the next middle collection: the collector's share of such a run
fell from 14 % to 7 %. Its middle collections are then fewer and longer (100-150 ms with
10,000 tasks alive, against 22-50 ms and the full ones) and a drain of short tasks, whose
attempts do not live through a young collection, does not notice.
"""

from __future__ import annotations

import gc

from .settings import Settings

__all__ = ["MIDDLE_THRESHOLD", "tune_gc"]

#: Young collections between two collections of the middle generation (Python's default: 10).
MIDDLE_THRESHOLD = 100


def tune_gc(settings: Settings) -> None:
    """Freeze what startup left, set the young generation's threshold to
    ``settings.gc_young_threshold`` and the middle one's to :data:`MIDDLE_THRESHOLD` (the
    oldest keeps Python's); a young threshold of 0 changes nothing."""
    threshold = settings.gc_young_threshold
    if not threshold:
        return
    gc.collect()
    gc.freeze()
    _, _, oldest = gc.get_threshold()
    gc.set_threshold(threshold, MIDDLE_THRESHOLD, oldest)
