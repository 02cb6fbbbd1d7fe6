-- phase: post-deploy
-- transaction: none
-- ix_dt_outbox_pending (id order) is replaced by ix_dt_outbox_pending_due (0007). Code before
-- version 7 claims through it, and without it each of its claims walks past every SENT row: drop
-- it once no process of that code runs.

DROP INDEX CONCURRENTLY IF EXISTS ix_dt_outbox_pending;
