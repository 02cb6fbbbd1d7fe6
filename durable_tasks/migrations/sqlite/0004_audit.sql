-- dt_audit: every operator action taken through the dashboard (who, what, when, result).
-- IF NOT EXISTS: code between versions 1 and 4 made this table without recording a version.

CREATE TABLE IF NOT EXISTS dt_audit (
    id INTEGER NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    at DATETIME NOT NULL,
    actor VARCHAR(200) NOT NULL,
    action VARCHAR(64) NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (id)
);

CREATE INDEX IF NOT EXISTS ix_dt_audit_ns ON dt_audit (namespace, id);
