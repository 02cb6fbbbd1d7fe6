-- Operators' views of dt_tasks (durable_tasks.readmodel): the task search, newest first, and
-- what finished lately (no partial index on MySQL: unfinished rows sit under one NULL prefix).

CREATE INDEX ix_dt_tasks_created ON dt_tasks (namespace, created_at, id);

CREATE INDEX ix_dt_tasks_finished ON dt_tasks (namespace, finished_at, id);
