-- transaction: none
-- The reconciler walks the tasks that were sent (ENQUEUED, or RUNNING on a lease that may have
-- run out) in (enqueued_at, id) order, a page after the last one it read: this index holds only
-- those tasks, so a page reads its entries and stops, however many finished tasks wait for
-- prune. Built CONCURRENTLY: dt_tasks can be large and busy.

CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_tasks_sent ON dt_tasks (namespace, enqueued_at, id)
    WHERE state = 'ENQUEUED' OR state = 'RUNNING';
