-- The step journal (durable_tasks.journal): dt_steps, and a child task's parent on dt_tasks.
-- Nullable columns: older code writes tasks without them, and InnoDB adds them in place.

ALTER TABLE dt_tasks
    ADD COLUMN parent_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    ADD COLUMN parent_generation INTEGER,
    ADD COLUMN parent_slot VARCHAR(200);

-- ix_dt_steps_open: open waits by kind, oldest first (no partial index on MySQL).
CREATE TABLE IF NOT EXISTS dt_steps (
    id INTEGER NOT NULL AUTO_INCREMENT,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    task_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    generation INTEGER NOT NULL,
    slot VARCHAR(200) NOT NULL,
    kind VARCHAR(16) NOT NULL,
    label VARCHAR(200) NOT NULL,
    done BOOL NOT NULL,
    result TEXT,
    request TEXT,
    child_task_id VARCHAR(36),
    child_state VARCHAR(16),
    error_type VARCHAR(200),
    error_message TEXT,
    created_at DATETIME(6) NOT NULL,
    finished_at DATETIME(6),
    PRIMARY KEY (id),
    CONSTRAINT uq_dt_steps_slot UNIQUE (task_id, generation, slot),
    INDEX ix_dt_steps_open (namespace, kind, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
