-- The dispatcher takes PENDING rows in due order (then id order). MySQL has no partial index:
-- the PENDING rows of a namespace are one range of ix_dt_outbox_state_due, in due order. Built
-- beside the index it replaces, which code before this version still uses: 0008 drops that one
-- after the deploy (InnoDB builds a secondary index online, without blocking writes).

CREATE INDEX ix_dt_outbox_state_due ON dt_outbox (namespace, state, next_attempt_at, id);
