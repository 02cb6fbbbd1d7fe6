-- The reconciler walks the tasks that were sent (ENQUEUED, or RUNNING on a lease that may have
-- run out) in (enqueued_at, id) order, a page after the last one it read. MySQL has no partial
-- index: the sent tasks of a namespace are two ranges of this one (one per state), read from
-- the cursor on.

CREATE INDEX ix_dt_tasks_sent ON dt_tasks (namespace, state, enqueued_at, id);
