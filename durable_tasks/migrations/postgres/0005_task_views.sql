-- transaction: none
-- Operators' views of dt_tasks (durable_tasks.readmodel): the task search, newest first, and
-- what finished lately. dt_tasks can be large and busy, so the indexes are built CONCURRENTLY:
-- writes go on meanwhile (an interrupted build leaves an invalid index, which the next
-- migrate drops and builds again). IF NOT EXISTS: code between versions 1 and 5 made them
-- without recording a version.

CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_tasks_created ON dt_tasks (namespace, created_at, id);

CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_tasks_finished ON dt_tasks (namespace, finished_at, id)
    WHERE finished_at IS NOT NULL;
