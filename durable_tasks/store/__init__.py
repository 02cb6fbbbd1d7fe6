"""The SQL side of the runtime: submit, claim, fence, commit, recover.

Functions here take an Engine or the caller's Session and use bound parameters only; loops
call them from worker threads. Most speak SQLAlchemy Core. The hot paths on PostgreSQL
(submit, the dispatcher's claim and mark-SENT, the worker's claim and group commit) run
named statements from ``sql/postgres.sql`` instead: one fixed text per batch, values in
arrays, prepared once per connection. The four one-statement ones are built as values
(:class:`.statement.OneStatement`), which the loops send on their event loop's own
connections (:mod:`.aio`) and sync callers from a thread. Their SQLite twins stay in Core beside them, and the
integration suites run every test against both.
"""
