-- adopted: run
-- CALL dt_submit(namespace, task, queue, payload, idempotency_key, max_attempts, shadow,
--                partition_key, traceparent)  -> one row: task_id
-- The SQL-level submit for producers that cannot import Python (a Java service, a mysql
-- script): in the caller's transaction it writes the rows App.submit writes (the task PENDING
-- at generation 0 and its first outbox row). A task submitted again under the same
-- idempotency key returns the existing task's id and writes nothing, as App.submit does; a
-- concurrent duplicate waits for the first and yields. The payload is JSON text (checked
-- here; the dispatcher checks it against the task's payload type). A procedure takes no
-- defaults: pass NULL for no key, partition key or traceparent, 3 for the task's default
-- max_attempts, FALSE for shadow. Dispatchers find the row at their next poll (MySQL has no
-- LISTEN/NOTIFY). Comparisons name the columns' collations (a parameter has its own).
-- DELIMITER lets the body keep its semicolons (the runner and the mysql client both read it).

DROP PROCEDURE IF EXISTS dt_submit;

DELIMITER //
CREATE PROCEDURE dt_submit(
    IN p_namespace VARCHAR(64) CHARACTER SET ascii,
    IN p_task VARCHAR(200) CHARACTER SET utf8mb4,
    IN p_queue VARCHAR(64) CHARACTER SET ascii,
    IN p_payload LONGTEXT CHARACTER SET utf8mb4,
    IN p_idempotency_key VARCHAR(512) CHARACTER SET utf8mb4,
    IN p_max_attempts INTEGER,
    IN p_shadow BOOL,
    IN p_partition_key VARCHAR(200) CHARACTER SET utf8mb4,
    IN p_traceparent VARCHAR(128) CHARACTER SET utf8mb4
)
MODIFIES SQL DATA
body: BEGIN
    DECLARE new_id VARCHAR(36) CHARACTER SET utf8mb4 DEFAULT UUID();
    DECLARE found_id VARCHAR(36) CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE at_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);

    IF p_namespace IS NULL OR NOT (p_namespace REGEXP '^[A-Za-z0-9_.-]{1,64}$') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dt_submit: namespace must match [A-Za-z0-9_.-]{1,64}';
    END IF;
    IF p_queue IS NULL OR NOT (p_queue REGEXP '^[A-Za-z0-9_.-]{1,64}$') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dt_submit: queue must match [A-Za-z0-9_.-]{1,64}';
    END IF;
    IF p_task IS NULL OR CHAR_LENGTH(p_task) NOT BETWEEN 1 AND 200 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dt_submit: task name must be 1-200 characters';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dt_submit: max_attempts must be at least 1';
    END IF;
    IF p_idempotency_key IS NOT NULL AND (TRIM(p_idempotency_key) = '' OR CHAR_LENGTH(p_idempotency_key) > 512
            OR p_idempotency_key REGEXP '[[:cntrl:]]') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
            'dt_submit: idempotency_key must be non-empty, at most 512 characters, without control characters; hash it';
    END IF;
    IF p_payload IS NULL OR NOT JSON_VALID(p_payload) THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dt_submit: payload must be JSON text';
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT t.id INTO found_id FROM dt_tasks AS t
        WHERE t.namespace = p_namespace COLLATE ascii_bin AND t.name = p_task COLLATE utf8mb4_bin
          AND t.idempotency_key = p_idempotency_key COLLATE utf8mb4_bin;
        IF found_id IS NOT NULL THEN
            SELECT found_id AS task_id;
            LEAVE body;
        END IF;
    END IF;

    -- A duplicate key waits for the other transaction, then changes nothing.
    INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, state, generation, attempt,
                          delivery, reclaims, counted_losses, failures, max_attempts, traceparent,
                          partition_key, shadow, created_at)
    VALUES (new_id, p_namespace, p_task, p_queue, p_idempotency_key, p_payload, 'PENDING', 0, 0, 0, 0, 0, 0,
            p_max_attempts, p_traceparent, p_partition_key, COALESCE(p_shadow, FALSE), at_now)
    ON DUPLICATE KEY UPDATE id = id;
    IF p_idempotency_key IS NOT NULL THEN
        SELECT t.id INTO found_id FROM dt_tasks AS t
        WHERE t.namespace = p_namespace COLLATE ascii_bin AND t.name = p_task COLLATE utf8mb4_bin
          AND t.idempotency_key = p_idempotency_key COLLATE utf8mb4_bin;
        IF found_id <> new_id THEN  -- a concurrent submit with the same key committed first
            SELECT found_id AS task_id;
            LEAVE body;
        END IF;
    END IF;

    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    VALUES (p_namespace, new_id, p_queue, 0, 0, 'PENDING', 0, at_now, COALESCE(p_shadow, FALSE), at_now);
    SELECT new_id AS task_id;
END //
DELIMITER ;
