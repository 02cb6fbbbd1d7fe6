-- dt_attempts.traceback: the traceback of a failed attempt (scrubbed, at most 8 KB).
-- Nullable: older code writes attempts without it, and adding it rewrites nothing.

ALTER TABLE dt_attempts ADD COLUMN traceback TEXT;
