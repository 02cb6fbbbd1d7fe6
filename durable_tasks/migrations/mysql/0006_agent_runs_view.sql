-- The dashboard's list of agent runs, newest first (durable_tasks.readmodel.agent_runs).

CREATE INDEX ix_dt_agent_runs_created ON dt_agent_runs (namespace, created_at, id);
