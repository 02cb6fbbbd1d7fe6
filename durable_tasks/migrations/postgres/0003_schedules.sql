-- dt_schedules: one row per periodic schedule of a namespace (durable_tasks.periodic).
-- IF NOT EXISTS: code between versions 1 and 3 made this table without recording a version.

CREATE TABLE IF NOT EXISTS dt_schedules (
    namespace VARCHAR(64) NOT NULL,
    name VARCHAR(200) NOT NULL,
    task_name VARCHAR(200) NOT NULL,
    spec VARCHAR(300) NOT NULL,
    catch_up VARCHAR(16) NOT NULL,
    paused BOOLEAN NOT NULL,
    last_tick_at TIMESTAMP WITH TIME ZONE NOT NULL,
    next_tick_at TIMESTAMP WITH TIME ZONE,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (namespace, name)
);
