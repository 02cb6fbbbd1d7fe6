-- A task's payload size in bytes, written with the payload: the dispatcher's claim and the
-- worker's carry a payload up to 64 KiB and read a larger one alone (store/payloads.py), and a
-- stored size decides which without measuring the value (SQLite's length() reads a long value
-- to count its characters, and counts characters, not bytes). Nullable: older code and
-- dt_submit write tasks without it, and the claims measure those; adding it rewrites nothing.

ALTER TABLE dt_tasks ADD COLUMN payload_bytes INTEGER;
