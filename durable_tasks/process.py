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

A worker with thousands of tasks in flight keeps each task's objects alive for as long as the
task runs (an agent's tool call awaits seconds), so they outlive the middle generation too, pass
to the oldest and trigger full collections. The middle generation is collected every
``concurrency // 100`` young collections (Python's 10 up to a concurrency of 1,000; 100 at
10,000): a task that ends within that time is freed from the middle generation. With 10,000
tasks awaiting 1 s: collector time 0.30 against 0.51 s per 50,000 tasks, no full collection
(``python -m benchmarks.profile_drain --n 50000 --concurrency 10000 --sleep 1``). At the
default concurrency nothing changes: collecting the middle generation ten times less often
there raised submit->start p99 at 200 tasks/s (12.7-16.8 against 9.2-13.3 ms).
"""

from __future__ import annotations

import gc

from .settings import Settings

__all__ = ["gc_thresholds", "tune_gc"]


def gc_thresholds(young: int, concurrency: int, python: tuple[int, int, int]) -> tuple[int, int, int]:
    """The collector's thresholds for a process running ``concurrency`` tasks at once, from
    Python's (``python``): ``young`` for the young generation, the middle one's scaled with
    the tasks in flight (never below Python's), the oldest one's as it was."""
    _, middle, oldest = python
    return young, max(middle, concurrency // 100), oldest


def tune_gc(settings: Settings) -> None:
    """Freeze what startup left and set the thresholds of :func:`gc_thresholds` for
    ``settings.gc_young_threshold`` and ``settings.concurrency``; a young threshold of 0
    changes nothing."""
    if not settings.gc_young_threshold:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*gc_thresholds(settings.gc_young_threshold, settings.concurrency, gc.get_threshold()))
