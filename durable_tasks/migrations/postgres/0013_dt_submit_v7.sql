-- dt_submit makes time-ordered task ids (UUIDv7), as App.submit does (durable_tasks/store/ids.py):
-- the tasks in flight then sit on the recent leaves of the dt_tasks primary key and of the
-- task_id indexes of dt_outbox and dt_attempts, instead of random leaves of indexes that, with
-- millions of finished tasks kept, no longer fit in the buffers (docs/performance-design.md).
-- 74 random bits from gen_random_uuid() follow the millisecond (PostgreSQL 18's uuidv7() is not
-- in the versions supported). Only the id changes: the signature, the checks and the rows
-- written are those of 0002_dt_submit. CREATE OR REPLACE keeps the function's owner and grants;
-- calls use the new body from this step's commit on.

CREATE OR REPLACE FUNCTION dt_submit(
    namespace text,
    task text,
    queue text,
    payload text,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT 3,
    shadow boolean DEFAULT false,
    partition_key text DEFAULT NULL,
    traceparent text DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    -- A UUIDv7 (RFC 9562), as App.submit makes: the Unix time in ms over the first 48 bits of
    -- a random UUID (version 4, variant RFC 9562), then the version nibble 4 -> 7 (bits 52, 53).
    new_id text := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid::text;
    found_id text;
BEGIN
    IF dt_submit.namespace IS NULL OR dt_submit.namespace !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION 'dt_submit: namespace % must match [A-Za-z0-9_.-]{1,64}', quote_literal(dt_submit.namespace)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF dt_submit.queue IS NULL OR dt_submit.queue !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION 'dt_submit: queue % must match [A-Za-z0-9_.-]{1,64}', quote_literal(dt_submit.queue)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF dt_submit.task IS NULL OR length(dt_submit.task) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'dt_submit: task name must be 1-200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF dt_submit.max_attempts IS NULL OR dt_submit.max_attempts < 1 THEN
        RAISE EXCEPTION 'dt_submit: max_attempts must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF dt_submit.idempotency_key IS NOT NULL AND (btrim(dt_submit.idempotency_key) = ''
            OR length(dt_submit.idempotency_key) > 512 OR dt_submit.idempotency_key ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'dt_submit: idempotency_key must be non-empty, at most 512 characters, without control characters; hash it'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM dt_submit.payload::jsonb;  -- raises invalid_text_representation on text that is not JSON

    IF dt_submit.idempotency_key IS NOT NULL THEN
        SELECT t.id INTO found_id FROM dt_tasks AS t
        WHERE t.namespace = dt_submit.namespace AND t.name = dt_submit.task
          AND t.idempotency_key = dt_submit.idempotency_key;
        IF found_id IS NOT NULL THEN
            RETURN found_id;
        END IF;
    END IF;

    INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, state, generation, attempt,
                          delivery, reclaims, counted_losses, failures, max_attempts, traceparent,
                          partition_key, shadow, created_at)
    VALUES (new_id, dt_submit.namespace, dt_submit.task, dt_submit.queue, dt_submit.idempotency_key,
            dt_submit.payload, 'PENDING', 0, 0, 0, 0, 0, 0, dt_submit.max_attempts, dt_submit.traceparent,
            dt_submit.partition_key, dt_submit.shadow, now())
    ON CONFLICT (namespace, name, idempotency_key) DO NOTHING;
    IF NOT FOUND THEN  -- a concurrent submit with the same key committed first
        SELECT t.id INTO found_id FROM dt_tasks AS t
        WHERE t.namespace = dt_submit.namespace AND t.name = dt_submit.task
          AND t.idempotency_key = dt_submit.idempotency_key;
        RETURN found_id;
    END IF;

    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    VALUES (dt_submit.namespace, new_id, dt_submit.queue, 0, 0, 'PENDING', 0, now(), dt_submit.shadow, now());
    PERFORM pg_notify('durable_tasks', dt_submit.namespace);
    RETURN new_id;
END
$$;
