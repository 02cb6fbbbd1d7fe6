-- dt_payloads: a large payload kept apart from its task row (store/payloads.py). SQLite
-- rewrites a whole row, long values included, on every update: a task row is updated as it is
-- dispatched, claimed and finished, and each rewrote its payload. Code from this version on
-- reads a payload from here first wherever it reads one; it writes payloads here only once
-- step 17 is applied (older code would read the '' left in dt_tasks.payload).

CREATE TABLE IF NOT EXISTS dt_payloads (
    task_id VARCHAR(36) NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (task_id)
);
