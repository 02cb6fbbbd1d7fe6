-- transaction: none
-- The dispatcher takes PENDING rows in due order (then id order): ix_dt_outbox_pending_due
-- holds only those, so a claim stops at the first row not due yet, however many SENT rows wait
-- for prune and however many delayed rows wait for their time. Built CONCURRENTLY beside the
-- index it replaces, which code before this version still uses: 0008 drops that one after the
-- deploy. IF NOT EXISTS: code between versions 1 and 7 made it without recording a version.

CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_dt_outbox_pending_due ON dt_outbox (namespace, next_attempt_at, id)
    WHERE state = 'PENDING';
