-- The schema create_all() made before versioning: dt_tasks, dt_outbox, dt_attempts and the
-- agent records. A database made by that code is adopted as version 1 (after checking it
-- matches this), not rebuilt.

CREATE TABLE dt_agent_runs (
    id VARCHAR(36) NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    agent VARCHAR(200) NOT NULL,
    generation INTEGER NOT NULL,
    state VARCHAR(16) NOT NULL,
    input TEXT NOT NULL,
    output TEXT,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    finished_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id)
);

CREATE TABLE dt_agent_turns (
    id SERIAL NOT NULL,
    run_id VARCHAR(36) NOT NULL,
    generation INTEGER NOT NULL,
    index INTEGER NOT NULL,
    output TEXT NOT NULL,
    calls TEXT NOT NULL,
    tool_results TEXT,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT uq_dt_agent_turn UNIQUE (run_id, generation, index)
);

CREATE INDEX ix_dt_agent_turns_run_id ON dt_agent_turns (run_id);

CREATE TABLE dt_attempts (
    id SERIAL NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    task_id VARCHAR(36) NOT NULL,
    generation INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    delivery INTEGER NOT NULL,
    worker_id VARCHAR(200) NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE NOT NULL,
    finished_at TIMESTAMP WITH TIME ZONE,
    outcome VARCHAR(16),
    error_type VARCHAR(200),
    error_message TEXT,
    retry_reason TEXT,
    traceparent VARCHAR(128),
    PRIMARY KEY (id)
);

CREATE INDEX ix_dt_attempts_task ON dt_attempts (task_id, generation, attempt);

CREATE TABLE dt_outbox (
    id SERIAL NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    task_id VARCHAR(36) NOT NULL,
    queue VARCHAR(64) NOT NULL,
    generation INTEGER NOT NULL,
    delivery INTEGER NOT NULL,
    state VARCHAR(16) NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_at TIMESTAMP WITH TIME ZONE NOT NULL,
    lease_expires_at TIMESTAMP WITH TIME ZONE,
    claim_token VARCHAR(36),
    last_error TEXT,
    shadow BOOLEAN NOT NULL,
    stream_id VARCHAR(64),
    partition INTEGER,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    sent_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id)
);

-- Only PENDING rows: a claim reads ~batch_size entries however many SENT rows wait for prune.
CREATE INDEX ix_dt_outbox_pending ON dt_outbox (namespace, id) WHERE state = 'PENDING';

CREATE INDEX ix_dt_outbox_task_id ON dt_outbox (task_id);

CREATE TABLE dt_tasks (
    id VARCHAR(36) NOT NULL,
    namespace VARCHAR(64) NOT NULL,
    name VARCHAR(200) NOT NULL,
    queue VARCHAR(64) NOT NULL,
    idempotency_key VARCHAR(512),
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
    lease_expires_at TIMESTAMP WITH TIME ZONE,
    worker_id VARCHAR(200),
    result TEXT,
    error_type VARCHAR(200),
    error_message TEXT,
    traceparent VARCHAR(128),
    partition_key VARCHAR(200),
    shadow BOOLEAN NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    enqueued_at TIMESTAMP WITH TIME ZONE,
    started_at TIMESTAMP WITH TIME ZONE,
    finished_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id),
    CONSTRAINT uq_dt_tasks_idem UNIQUE (namespace, name, idempotency_key)
);

CREATE INDEX ix_dt_tasks_state ON dt_tasks (namespace, state, queue);
