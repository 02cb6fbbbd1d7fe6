-- dt_submit(namespace, task, queue, payload, idempotency_key, max_attempts, shadow,
--           partition_key, traceparent) -> task id
-- The SQL-level submit for producers that cannot import Python (a Java service, a psql
-- script): in the caller's transaction it writes the rows App.submit writes (the task
-- PENDING at generation 0 and its first outbox row) and wakes the dispatchers at commit. A
-- task submitted again under the same idempotency key returns the existing task's id and
-- writes nothing, as App.submit does; a concurrent duplicate waits for the first and yields.
-- The payload is JSON text (checked here; the dispatcher checks it against the task's payload
-- type). max_attempts is the task's own (@app.task(max_attempts=...), default 3).
-- SET search_path FROM CURRENT: the function writes the tables beside it whatever the
-- caller's search_path.

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
    new_id text := gen_random_uuid()::text;
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
