-- The dashboard's list of agent runs, newest first (durable_tasks.readmodel.agent_runs).
-- IF NOT EXISTS: code between versions 1 and 6 made it without recording a version.

CREATE INDEX IF NOT EXISTS ix_dt_agent_runs_created ON dt_agent_runs (namespace, created_at, id);
