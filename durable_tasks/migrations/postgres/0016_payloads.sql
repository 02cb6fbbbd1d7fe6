-- dt_payloads: a large payload kept apart from its task row (store/payloads.py). SQLite and
-- MySQL/MariaDB stores write a payload over 4 KiB here once step 17 allows it. PostgreSQL's
-- stores never do (TOAST keeps a long value apart already, and an update of other columns keeps
-- its pointer), so the table stays empty here; it exists so that every backend has the same
-- tables, and code from this version on reads a payload from it first wherever it is.

CREATE TABLE IF NOT EXISTS dt_payloads (
    task_id VARCHAR(36) NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (task_id)
);
