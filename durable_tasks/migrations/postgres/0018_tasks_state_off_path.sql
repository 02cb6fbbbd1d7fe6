-- phase: post-deploy
-- transaction: none
-- ix_dt_tasks_state keeps only the tasks off the hot path (PENDING, RETRYING, WAITING, FAILED,
-- DEAD, CANCELLED): a task's dispatch, claim and result each changed its state and so wrote an
-- entry into an index of every state; now a task that succeeds at its first attempt writes one
-- (durable_tasks/state_indexes.py). The code of this version reads ENQUEUED and RUNNING tasks
-- through ix_dt_tasks_sent and repeats each partial index's predicate; older code may plan its
-- counts of those states without it: apply this once no process of that code runs.
-- The new index is built beside the old one, CONCURRENTLY (dt_tasks can be large and busy), and
-- takes its name; run again after a failure, the step picks up where it stopped.

CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_tasks_state_off_path ON dt_tasks (namespace, state, queue)
    WHERE state = 'PENDING' OR state = 'RETRYING' OR state = 'WAITING' OR state = 'FAILED'
       OR state = 'DEAD' OR state = 'CANCELLED';

DROP INDEX CONCURRENTLY IF EXISTS ix_dt_tasks_state;

ALTER INDEX IF EXISTS ix_dt_tasks_state_off_path RENAME TO ix_dt_tasks_state;
