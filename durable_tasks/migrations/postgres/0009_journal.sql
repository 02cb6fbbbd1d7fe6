-- The step journal (durable_tasks.journal): dt_steps, and a child task's parent on dt_tasks.
-- Nullable columns: older code writes tasks without them, and adding them rewrites nothing.
-- IF NOT EXISTS: code between versions 1 and 9 made these without recording a version.

ALTER TABLE dt_tasks ADD COLUMN IF NOT EXISTS parent_id VARCHAR(36);

ALTER TABLE dt_tasks ADD COLUMN IF NOT EXISTS parent_generation INTEGER;

ALTER TABLE dt_tasks ADD COLUMN IF NOT EXISTS parent_slot VARCHAR(200);

CREATE TABLE IF NOT EXISTS dt_steps (
    id SERIAL NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    task_id VARCHAR(36) NOT NULL,
    generation INTEGER NOT NULL,
    slot VARCHAR(200) NOT NULL,
    kind VARCHAR(16) NOT NULL,
    label VARCHAR(200) NOT NULL,
    done BOOLEAN NOT NULL,
    result TEXT,
    request TEXT,
    child_task_id VARCHAR(36),
    child_state VARCHAR(16),
    error_type VARCHAR(200),
    error_message TEXT,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    finished_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id),
    CONSTRAINT uq_dt_steps_slot UNIQUE (task_id, generation, slot)
);

-- Open waits by kind, oldest first: the approvals listing reads only these.
CREATE INDEX IF NOT EXISTS ix_dt_steps_open ON dt_steps (namespace, kind, id) WHERE NOT done;
