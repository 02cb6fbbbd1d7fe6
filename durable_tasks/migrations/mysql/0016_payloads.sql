-- dt_payloads: a large payload kept apart from its task row (store/payloads.py). InnoDB reads
-- a whole row, long values included, for every locking read and update of it, whatever the
-- statement names (benchmarks/mysql_row_reads.py: about 2 ms per row and MB), and a task row is
-- locked and updated as it is dispatched, claimed and finished. Code from this version on reads
-- a payload from here first wherever it reads one; it writes payloads here only once step 17 is
-- applied (older code would read the '' left in dt_tasks.payload).

CREATE TABLE IF NOT EXISTS dt_payloads (
    task_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload MEDIUMTEXT NOT NULL,
    PRIMARY KEY (task_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
