-- dt_schedules: one row per periodic schedule of a namespace (durable_tasks.periodic).

CREATE TABLE IF NOT EXISTS dt_schedules (
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    task_name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    spec VARCHAR(300) NOT NULL,
    catch_up VARCHAR(16) NOT NULL,
    paused BOOL NOT NULL,
    last_tick_at DATETIME(6) NOT NULL,
    next_tick_at DATETIME(6),
    created_at DATETIME(6) NOT NULL,
    updated_at DATETIME(6) NOT NULL,
    PRIMARY KEY (namespace, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
