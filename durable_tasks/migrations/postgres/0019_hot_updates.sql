-- dt_outbox and dt_attempts leave half of each page free (fillfactor 50). Each of their rows is
-- updated in place once without a change to an indexed column: an outbox row's lease by the
-- dispatcher, an attempt's close by its worker. With room on the row's page, that update is a
-- heap-only tuple: no entry in any index, less WAL and less work for the statement (the
-- figures: docs/performance-design.md). The price is space for the attempts: their history,
-- until pruned, takes up to twice the pages. The outbox gets smaller during a drain (a lease no
-- longer moves its row to another page), and its sent rows go with each prune.
-- The setting applies to the pages written from now on; rows already stored stay where they are.
-- It takes a SHARE UPDATE EXCLUSIVE lock, which reads and writes of the tables do not wait for.

ALTER TABLE dt_outbox SET (fillfactor = 50);

ALTER TABLE dt_attempts SET (fillfactor = 50);
