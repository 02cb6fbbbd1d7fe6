-- phase: post-deploy
-- transaction: none
-- ix_dt_tasks_state leaves out the tasks that succeeded (durable_tasks/state_indexes.py): the
-- history, most of the table, is no longer in it, and a task's result writes no entry to it.
-- The code of this version repeats the predicate in the queries that read it; older code plans
-- them with the states as parameters, and a generic plan of those cannot read a partial index:
-- apply this once no process of that code runs.
-- The new index is built beside the old one, CONCURRENTLY (dt_tasks can be large and busy), and
-- takes its name; run again after a failure, the step picks up where it stopped.

CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_tasks_state_partial ON dt_tasks (namespace, state, queue)
    WHERE state <> 'SUCCEEDED';

DROP INDEX CONCURRENTLY IF EXISTS ix_dt_tasks_state;

ALTER INDEX IF EXISTS ix_dt_tasks_state_partial RENAME TO ix_dt_tasks_state;
