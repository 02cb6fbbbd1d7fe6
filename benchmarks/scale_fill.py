"""Rows made by SQL for bench_scale, in each dialect: a history of finished tasks (with their
attempt and outbox rows) and a backlog of pending ones (with their outbox rows).

The rows are what the runtime would have written, made by the database itself rather than by
running tasks, so 10,000,000 of them take minutes, not hours: PostgreSQL's
``generate_series``; SQLite's recursive CTE; on MySQL/MariaDB a cross join of digit tables
(MySQL 8 caps recursive CTEs at 1,000 rows by default, and MariaDB's sequence tables are not
MySQL's). SQLite and MySQL fill in chunks of :data:`CHUNK` rows, one transaction each, so no
statement holds millions of rows of undo. A history spans 40 to 10 days ago (prune's default
cut of 7 days keeps none of it). Its task ids are UUIDv7-shaped from each task's creation time,
as submit makes them (store/ids.py): older than the new tasks' and in time order, so a prune of
the oldest finds them together at the low end of the primary key. ``random_ids=True`` spreads
them over the whole key instead (UUIDv4-like: ids from another generator, or a history that
keeps old tasks rerun), the harder case for a prune, which then deletes from pages all over the
indexes. A backlog's ids are UUIDv7-shaped too, in the time order submit gives them.
"""

from __future__ import annotations

import math
import time

import sqlalchemy as sa

from durable_tasks import App

__all__ = ["CHUNK", "fill_backlog", "fill_history", "fill_tasks"]

#: rows per statement on SQLite and MySQL
CHUNK = 500_000

_PG_HISTORY = """
INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery, reclaims,
    counted_losses, failures, max_attempts, worker_id, result, shadow, created_at, enqueued_at, started_at,
    finished_at)
SELECT {id}, :ns, 'scale.noop', 'scale', g::text, 'SUCCEEDED', 0, 1, 0, 0, 0, 0, 3,
    'worker-' || (g % 4), g::text, false, t.created, t.created + interval '20 ms',
    t.created + interval '30 ms', t.created + interval '40 ms'
FROM generate_series(:lo + 1, :hi) AS g,
LATERAL (SELECT now() - interval '40 days' + g * (interval '30 days' / :rows) AS created) AS t
"""

_PG_RANDOM_ID = "md5(:ns || g)::uuid::text"
# A UUIDv7 of the task's creation time (store/ids.py), the rest from the digest.
_PG_TIME_ID = """overlay(overlay(overlay(md5(:ns || g)
        placing lpad(to_hex((extract(epoch FROM t.created) * 1000)::bigint), 12, '0') from 1 for 12)
        placing '7' from 13 for 1) placing '8' from 17 for 1)::uuid::text"""

# SQLAlchemy keeps a SQLite timestamp as text, 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC; strftime's
# %f has milliseconds, so three zeros complete it.
_SQLITE_HISTORY = """
WITH RECURSIVE g(x) AS (SELECT :lo + 1 UNION ALL SELECT x + 1 FROM g WHERE x < :hi),
r AS (SELECT x, lower(hex(randomblob(16))) AS h, x * 2592000.0 / :rows AS s FROM g),
v AS (SELECT x, h, s,
             printf('%012x', CAST(((julianday('now', '-40 days') - 2440587.5) * 86400 + s) * 1000 AS INTEGER)) AS t
      FROM r)
INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery, reclaims,
    counted_losses, failures, max_attempts, worker_id, result, shadow, created_at, enqueued_at, started_at,
    finished_at)
SELECT {id},
    :ns, 'scale.noop', 'scale', x, 'SUCCEEDED', 0, 1, 0, 0, 0, 0, 3, 'worker-' || (x % 4), x, 0,
    strftime('%Y-%m-%d %H:%M:%f', 'now', '-40 days', printf('+%.3f seconds', s)) || '000',
    strftime('%Y-%m-%d %H:%M:%f', 'now', '-40 days', printf('+%.3f seconds', s + 0.02)) || '000',
    strftime('%Y-%m-%d %H:%M:%f', 'now', '-40 days', printf('+%.3f seconds', s + 0.03)) || '000',
    strftime('%Y-%m-%d %H:%M:%f', 'now', '-40 days', printf('+%.3f seconds', s + 0.04)) || '000'
FROM v
"""
_SQLITE_RANDOM_ID = """substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) || '-' || substr(h, 17, 4)
        || '-' || substr(h, 21, 12)"""
_SQLITE_TIME_ID = """substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(h, 1, 3) || '-8' || substr(h, 4, 3)
        || '-' || substr(h, 7, 12)"""


def _mysql_numbers(count: int) -> str:
    """A derived table ``n(g)`` of :lo + 1 .. :lo + 10^k, 10^k >= count: k digit tables cross-joined."""
    digits = max(1, math.ceil(math.log10(max(count, 2))))
    digit = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"
    terms = " + ".join(f"{10**i} * d{i}.d" for i in range(digits))
    joins = " CROSS JOIN ".join(f"{digit} AS d{i}" for i in range(digits))
    return f"(SELECT :lo + {terms} + 1 AS g FROM {joins}) AS n"


_MYSQL_RANDOM_ID = """CONCAT_WS('-', SUBSTRING(h, 1, 8), SUBSTRING(h, 9, 4), SUBSTRING(h, 13, 4),
        SUBSTRING(h, 17, 4), SUBSTRING(h, 21, 12))"""
_MYSQL_TIME_ID = """CONCAT_WS('-', SUBSTRING(ms, 1, 8), SUBSTRING(ms, 9, 4), CONCAT('7', SUBSTRING(h, 1, 3)),
        CONCAT('8', SUBSTRING(h, 4, 3)), SUBSTRING(h, 7, 12))"""


def _mysql_history(count: int, task_id: str) -> str:
    return f"""
INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery, reclaims,
    counted_losses, failures, max_attempts, worker_id, result, shadow, created_at, enqueued_at, started_at,
    finished_at)
SELECT {task_id},
    :ns, 'scale.noop', 'scale', g, 'SUCCEEDED', 0, 1, 0, 0, 0, 0, 3, CONCAT('worker-', g % 4), g, false,
    created, created + INTERVAL 20000 MICROSECOND, created + INTERVAL 30000 MICROSECOND,
    created + INTERVAL 40000 MICROSECOND
FROM (SELECT g, MD5(CONCAT(:ns, g)) AS h,
             UTC_TIMESTAMP(6) - INTERVAL 40 DAY + INTERVAL (g * (2592000000000 DIV :rows)) MICROSECOND AS created,
             -- the creation time in ms (3,456,000,000 ms: the 40 days back to the start)
             LPAD(LOWER(HEX(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) - 3456000000
                            + g * (2592000000000 DIV :rows) DIV 1000)), 12, '0') AS ms
      FROM {_mysql_numbers(count)} WHERE g <= :hi) AS t
"""


# The attempt and outbox rows of a history, from its tasks: the same SQL in every dialect.
_HISTORY_ATTEMPTS = """
INSERT INTO dt_attempts (namespace, task_id, generation, attempt, delivery, worker_id, started_at, finished_at,
    outcome)
SELECT namespace, id, 0, 1, 0, worker_id, started_at, finished_at, 'succeeded' FROM dt_tasks WHERE namespace = :ns
{order}"""
_HISTORY_OUTBOX = """
INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at, shadow,
    stream_id, created_at, sent_at)
SELECT namespace, id, queue, 0, 0, 'SENT', 1, created_at, false, '0-1', created_at, enqueued_at
FROM dt_tasks WHERE namespace = :ns
{order}"""
#: The attempt and outbox rows' own ids (auto-increment) follow their tasks' time, as the runtime's
#: claims and submits make them, whatever the task ids: PostgreSQL and SQLite read the tasks back
#: in the order they were written; InnoDB in primary-key order, which random task ids scatter.
_CREATION_ORDER = "ORDER BY created_at, id"

_PG_BACKLOG = """
INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery, reclaims,
    counted_losses, failures, max_attempts, shadow, created_at)
SELECT overlay(overlay(overlay(md5(:ns || 'b' || g)  -- a UUIDv7 as submit makes it (store/ids.py)
           placing lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint + g), 12, '0') from 1 for 12)
           placing '7' from 13 for 1) placing '8' from 17 for 1)::uuid::text,
    :ns, 'scale.noop', 'scale', g::text, 'PENDING', 0, 0, 0, 0, 0, 0, 3, false, now()
FROM generate_series(:lo + 1, :hi) AS g
"""
_SQLITE_BACKLOG = """
WITH RECURSIVE g(x) AS (SELECT :lo + 1 UNION ALL SELECT x + 1 FROM g WHERE x < :hi),
r AS (SELECT x, printf('%012x', CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + x) AS t,
             lower(hex(randomblob(10))) AS h FROM g)
INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery, reclaims,
    counted_losses, failures, max_attempts, shadow, created_at)
SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(h, 1, 3) || '-8' || substr(h, 4, 3) || '-'
        || substr(h, 7, 12),
    :ns, 'scale.noop', 'scale', x, 'PENDING', 0, 0, 0, 0, 0, 0, 3, 0,
    strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'
FROM r
"""


def _mysql_backlog(count: int) -> str:
    return f"""
INSERT INTO dt_tasks (id, namespace, name, queue, payload, state, generation, attempt, delivery, reclaims,
    counted_losses, failures, max_attempts, shadow, created_at)
SELECT CONCAT_WS('-', SUBSTRING(t, 1, 8), SUBSTRING(t, 9, 4), CONCAT('7', SUBSTRING(h, 1, 3)),
        CONCAT('8', SUBSTRING(h, 4, 3)), SUBSTRING(h, 7, 12)),
    :ns, 'scale.noop', 'scale', g, 'PENDING', 0, 0, 0, 0, 0, 0, 3, false, UTC_TIMESTAMP(6)
FROM (SELECT g, LPAD(LOWER(HEX(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) + g)), 12, '0') AS t,
             MD5(CONCAT(:ns, 'b', g)) AS h
      FROM {_mysql_numbers(count)} WHERE g <= :hi) AS s
"""


_BACKLOG_OUTBOX = """
INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at, shadow,
    created_at)
SELECT namespace, id, queue, 0, 0, 'PENDING', 0, created_at, false, created_at
FROM dt_tasks WHERE namespace = :ns AND state = 'PENDING'
"""


#: A history task's id in each dialect: (spread over the key, in time order as submit makes it).
_HISTORY_IDS = {
    "postgresql": (_PG_RANDOM_ID, _PG_TIME_ID),
    "sqlite": (_SQLITE_RANDOM_ID, _SQLITE_TIME_ID),
    "mysql": (_MYSQL_RANDOM_ID, _MYSQL_TIME_ID),
}


def _tasks_sql(app: App, kind: str, count: int, random_ids: bool) -> str:
    dialect = "mysql" if app.engine.dialect.name == "mariadb" else app.engine.dialect.name
    if dialect not in _HISTORY_IDS:
        raise ValueError(f"no fill SQL for {dialect}")
    random_id, time_id = _HISTORY_IDS[dialect]
    task_id = random_id if random_ids else time_id
    history = kind == "history"
    if dialect == "postgresql":
        return _PG_HISTORY.format(id=task_id) if history else _PG_BACKLOG
    if dialect == "sqlite":
        return _SQLITE_HISTORY.format(id=task_id) if history else _SQLITE_BACKLOG
    return _mysql_history(count, task_id) if history else _mysql_backlog(count)


def fill_tasks(app: App, ns: str, kind: str, rows: int, lo: int, hi: int, *, random_ids: bool = False) -> None:
    """Tasks ``lo + 1`` to ``hi`` of a ``rows``-task history or backlog (``kind``), in one
    transaction; a task's place in the whole sets its time (and, unless ``random_ids``, its id)."""
    sql = _tasks_sql(app, kind, hi - lo, random_ids)
    with app.engine.begin() as conn:
        conn.execute(sa.text(sql), {"ns": ns, "rows": rows, "lo": lo, "hi": hi})


def _fill(app: App, ns: str, kind: str, rows: int, then: list[str], *, random_ids: bool = False) -> float:
    started = time.monotonic()
    # PostgreSQL makes any number of rows in one statement; the others one chunk at a time.
    chunk = rows if app.engine.dialect.name == "postgresql" else CHUNK
    for lo in range(0, rows, chunk):
        fill_tasks(app, ns, kind, rows, lo, min(rows, lo + chunk), random_ids=random_ids)
    with app.engine.begin() as conn:
        for statement in then:
            conn.execute(sa.text(statement), {"ns": ns})
    _analyze(app)
    return time.monotonic() - started


def _analyze(app: App) -> None:
    """Statistics as a live table has them: PostgreSQL's autovacuum and MySQL's persistent
    statistics keep them (here made at once, with PostgreSQL's visibility map); SQLite has none
    unless someone runs ANALYZE, which the runtime does not, so neither does the benchmark."""
    dialect = app.engine.dialect.name
    if dialect == "sqlite":
        return
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if dialect == "postgresql":
            conn.execute(sa.text("VACUUM ANALYZE dt_tasks, dt_attempts, dt_outbox"))
        else:
            conn.execute(sa.text("ANALYZE TABLE dt_tasks, dt_attempts, dt_outbox"))


def fill_history(app: App, ns: str, rows: int, *, random_ids: bool = False) -> float:
    """``rows`` finished tasks, each with its attempt and SENT outbox row; returns the seconds
    taken. Their ids are in time order unless ``random_ids`` (see the module's docstring)."""
    order = _CREATION_ORDER if random_ids and app.engine.dialect.name in ("mysql", "mariadb") else ""
    then = [_HISTORY_ATTEMPTS.format(order=order), _HISTORY_OUTBOX.format(order=order)]
    return _fill(app, ns, "history", rows, then, random_ids=random_ids)


def fill_backlog(app: App, ns: str, rows: int) -> float:
    """``rows`` PENDING tasks, each with its PENDING outbox row, due now; returns the seconds taken."""
    return _fill(app, ns, "backlog", rows, [_BACKLOG_OUTBOX])
