"""The SQL side of the runtime: submit, claim, fence, commit, recover.

Functions here take an Engine or the caller's Session and speak SQLAlchemy Core with bound
parameters only; loops call them from worker threads. PostgreSQL and SQLite differ only in
how the dispatcher claims outbox rows (see :mod:`.outbox`).
"""
