-- phase: post-deploy
-- ix_dt_outbox_pending (id order) is replaced by ix_dt_outbox_state_due (0007). Code before
-- version 7 claims through it: drop it once no process of that code runs.

DROP INDEX ix_dt_outbox_pending ON dt_outbox;
