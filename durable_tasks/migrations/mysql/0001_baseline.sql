-- The first schema durable_tasks made on MySQL/MariaDB: dt_tasks, dt_outbox, dt_attempts and
-- the agent records, on InnoDB. DATETIME(6) keeps the microseconds; ids, task names and
-- idempotency keys compare byte for byte (utf8mb4_bin), namespaces and queues are ASCII (which
-- keeps uq_dt_tasks_idem within InnoDB's 3,072-byte key). MySQL commits each DDL statement on
-- its own: a step interrupted halfway is finished by hand (the error names the statement).
-- Tables made by create_all() before MySQL had versions are adopted at the version they match.

CREATE TABLE dt_agent_runs (
    id VARCHAR(36) NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    agent VARCHAR(200) NOT NULL,
    generation INTEGER NOT NULL,
    state VARCHAR(16) NOT NULL,
    input TEXT NOT NULL,
    output TEXT,
    created_at DATETIME NOT NULL,
    finished_at DATETIME,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE dt_agent_turns (
    id INTEGER NOT NULL AUTO_INCREMENT,
    run_id VARCHAR(36) NOT NULL,
    generation INTEGER NOT NULL,
    `index` INTEGER NOT NULL,
    output TEXT NOT NULL,
    calls TEXT NOT NULL,
    tool_results TEXT,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT uq_dt_agent_turn UNIQUE (run_id, generation, `index`),
    INDEX ix_dt_agent_turns_run_id (run_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE dt_attempts (
    id INTEGER NOT NULL AUTO_INCREMENT,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    task_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    generation INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    delivery INTEGER NOT NULL,
    worker_id VARCHAR(200) NOT NULL,
    started_at DATETIME(6) NOT NULL,
    finished_at DATETIME(6),
    outcome VARCHAR(16),
    error_type VARCHAR(200),
    error_message TEXT,
    retry_reason TEXT,
    traceparent VARCHAR(128),
    PRIMARY KEY (id),
    INDEX ix_dt_attempts_task (task_id, generation, attempt)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- ix_dt_outbox_pending: MySQL has no partial index; the PENDING rows of a namespace are one
-- range of (namespace, state, id).
CREATE TABLE dt_outbox (
    id INTEGER NOT NULL AUTO_INCREMENT,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    task_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    queue VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    generation INTEGER NOT NULL,
    delivery INTEGER NOT NULL,
    state VARCHAR(16) NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_at DATETIME(6) NOT NULL,
    lease_expires_at DATETIME(6),
    claim_token VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    last_error TEXT,
    shadow BOOL NOT NULL,
    stream_id VARCHAR(64),
    `partition` INTEGER,
    created_at DATETIME(6) NOT NULL,
    sent_at DATETIME(6),
    PRIMARY KEY (id),
    INDEX ix_dt_outbox_pending (namespace, state, id),
    INDEX ix_dt_outbox_task_id (task_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE dt_tasks (
    id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    queue VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idempotency_key VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    payload TEXT NOT NULL,
    state VARCHAR(16) NOT NULL,
    generation INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    delivery INTEGER NOT NULL,
    reclaims INTEGER NOT NULL,
    counted_losses INTEGER NOT NULL,
    solo_attempt INTEGER,
    failures INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    lease_expires_at DATETIME(6),
    worker_id VARCHAR(200),
    result TEXT,
    error_type VARCHAR(200),
    error_message TEXT,
    traceparent VARCHAR(128),
    partition_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    shadow BOOL NOT NULL,
    created_at DATETIME(6) NOT NULL,
    enqueued_at DATETIME(6),
    started_at DATETIME(6),
    finished_at DATETIME(6),
    PRIMARY KEY (id),
    CONSTRAINT uq_dt_tasks_idem UNIQUE (namespace, name, idempotency_key),
    INDEX ix_dt_tasks_state (namespace, state, queue)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
