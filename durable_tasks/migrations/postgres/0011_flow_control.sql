-- Flow control (durable_tasks.flow): a task's priority level and its concurrency key, which
-- the dispatcher copies onto the stream entry. Nullable (NULL priority is level 0): older
-- code and dt_submit write tasks without them, and adding them rewrites nothing.

ALTER TABLE dt_tasks ADD COLUMN IF NOT EXISTS priority INTEGER;

ALTER TABLE dt_tasks ADD COLUMN IF NOT EXISTS concurrency_key VARCHAR(200);
