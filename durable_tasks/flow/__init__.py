"""Flow control: priorities, rate limits and per-key concurrency limits across every worker.

:mod:`.policy` holds the pure decisions (levels, the starvation guard, rates); the Redis side
is ``transport/lua/read_levels.lua`` (priority reads) and ``transport/lua/admit.lua``
(admission); :mod:`.gate` is the worker's I/O around admission. docs/flow-control.md says how
the pieces fit and why.
"""
