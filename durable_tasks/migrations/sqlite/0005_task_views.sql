-- Operators' views of dt_tasks (durable_tasks.readmodel): the task search, newest first, and
-- what finished lately. IF NOT EXISTS: code between versions 1 and 5 made them without
-- recording a version.

CREATE INDEX IF NOT EXISTS ix_dt_tasks_created ON dt_tasks (namespace, created_at, id);

CREATE INDEX IF NOT EXISTS ix_dt_tasks_finished ON dt_tasks (namespace, finished_at, id)
    WHERE finished_at IS NOT NULL;
