-- adopted: run
-- dt_submit makes time-ordered task ids (UUIDv7), as App.submit does (durable_tasks/store/ids.py):
-- the tasks in flight then sit on the recent leaves of the dt_tasks primary key and of the
-- task_id indexes of dt_outbox and dt_attempts (UUID() makes version-1 ids, whose text starts
-- with the clock's fastest-changing bits: random leaves; docs/performance-design.md). Only the id
-- changes: the arguments, the checks and the rows written are those of 0002_dt_submit, whose
-- comments hold. MySQL has no CREATE OR REPLACE PROCEDURE: the procedure is dropped and created
-- again, so a CALL between the two fails (its transaction rolls back; call again), and with
-- automatic_sp_privileges (the default) the EXECUTE grants on dt_submit go with the old one:
-- grant them again. Runs when tables are adopted (like 0002), after 0002.

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
    DECLARE at_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    DECLARE new_id VARCHAR(36) CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE found_id VARCHAR(36) CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE millis_hex CHAR(12) CHARACTER SET ascii
        DEFAULT LPAD(LOWER(HEX(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', at_now) DIV 1000)), 12, '0');
    DECLARE random_hex CHAR(20) CHARACTER SET ascii DEFAULT NULL;

    -- The task id, a UUIDv7 (RFC 9562) as App.submit makes: the Unix time in ms of at_now (the
    -- task's created_at), the version 7, 12 random bits, the variant (10) and 62 random bits.
    BEGIN
        -- MariaDB before 10.10 has no RANDOM_BYTES (error 1305: no such function): there the
        -- random bits are a hash of UUID() (unique on the server) and RAND(); the id stays
        -- unique and time-ordered, but is not unpredictable as RANDOM_BYTES makes it.
        DECLARE CONTINUE HANDLER FOR 1305
            SET random_hex = LEFT(SHA2(CONCAT_WS(',', UUID(), RAND(), CONNECTION_ID(), SYSDATE(6)), 256), 20);
        SET random_hex = LOWER(HEX(RANDOM_BYTES(10)));
    END;
    SET new_id = CONCAT(LEFT(millis_hex, 8), '-', RIGHT(millis_hex, 4), '-7', LEFT(random_hex, 3), '-',
                        LOWER(HEX(8 | (CONV(SUBSTRING(random_hex, 4, 1), 16, 10) & 3))), SUBSTRING(random_hex, 5, 3),
                        '-', RIGHT(random_hex, 12));

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
