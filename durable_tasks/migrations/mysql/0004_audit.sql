-- dt_audit: every operator action taken through the dashboard (who, what, when, result).

CREATE TABLE IF NOT EXISTS dt_audit (
    id INTEGER NOT NULL AUTO_INCREMENT,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at DATETIME(6) NOT NULL,
    actor VARCHAR(200) NOT NULL,
    action VARCHAR(64) NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (id),
    INDEX ix_dt_audit_ns (namespace, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
