-- Flow control (durable_tasks.flow): a task's priority level and its concurrency key, which
-- the dispatcher copies onto the stream entry. Nullable (NULL priority is level 0): older
-- code and dt_submit write tasks without them, and InnoDB adds them in place.

ALTER TABLE dt_tasks
    ADD COLUMN priority INTEGER,
    ADD COLUMN concurrency_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
