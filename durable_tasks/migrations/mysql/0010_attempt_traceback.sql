-- dt_attempts.traceback: the traceback of a failed attempt (scrubbed, at most 8 KB).
-- Nullable: older code writes attempts without it, and InnoDB adds it in place.

ALTER TABLE dt_attempts ADD COLUMN traceback TEXT;
