-- The runtime's hot-path statements on PostgreSQL, one per name.
--
-- Each works on a whole batch through parallel arrays (unnest), so a batch costs one
-- statement and one round trip however many rows it holds, and the statement text never
-- changes (psycopg prepares it after a few runs). Parameters are psycopg's %(name)s; the
-- arrays are %(name)b, sent in binary: as text, psycopg quotes a list element by element (a
-- regular-expression test of every string), a large share of the client CPU of a big batch.
-- Every multi-row write of dt_tasks first locks its rows ORDER BY id (see store/postgres)
-- in a MATERIALIZED CTE that finds them by primary key alone, and then tests state, fence and
-- namespace on those locked rows, never in a WHERE the planner could answer from
-- ix_dt_tasks_state: a queue table's statistics are always stale (rows pass PENDING ->
-- RUNNING -> SUCCEEDED in milliseconds), and a planner that believed RUNNING rare scans every
-- RUNNING row once per result, or a whole namespace per claim.
-- The rare paths (and the other dialects) speak SQLAlchemy Core (store/*.py); these must mean
-- the same.

-- name: claim_executions
-- The execution fence for a batch of deliveries, and one dt_attempts row per claimed
-- execution, in one statement: arrays ids, generations, deliveries; trace_ids and
-- traceparents (each attempt's trace context). Claimable: same generation and delivery,
-- PENDING/ENQUEUED/RETRYING, or RUNNING with an expired lease. Returns the claimed rows
-- (attempt already incremented; a payload over inline_payload bytes as NULL, its attempt reads
-- it alone), each with the trace context of its task's latest earlier attempt (a re-run: a
-- retry, a resume, a new generation; its new attempt's span links to it), whose attempts a
-- lost worker left open are closed as lost (store/execution.py's after_claim, which the other
-- dialects run after the claim). The attempt this statement opens is not in its snapshot, so
-- neither reads it as an earlier one.
WITH locked AS MATERIALIZED (
    SELECT c.id, c.namespace, c.state, c.generation, c.delivery, c.lease_expires_at
    FROM dt_tasks AS c
    WHERE c.id = ANY(%(ids)b::text[])
    ORDER BY c.id
    FOR UPDATE OF c
), claimable AS MATERIALIZED (
    SELECT DISTINCT l.id
    FROM locked AS l
    JOIN unnest(%(ids)b::text[], %(generations)b::int[], %(deliveries)b::int[]) AS d (id, generation, delivery)
      ON d.id = l.id AND d.generation = l.generation AND d.delivery = l.delivery
    WHERE l.namespace = %(namespace)s
      AND (l.state IN ('PENDING', 'ENQUEUED', 'RETRYING')
           OR (l.state = 'RUNNING' AND l.lease_expires_at <= %(now)s))
), claimed AS (
    UPDATE dt_tasks AS t
    SET state = 'RUNNING',
        attempt = t.attempt + 1,
        lease_expires_at = %(lease_until)s,
        worker_id = %(worker_id)s,
        -- a held attempt (a suspect's, or any with hold: execution.CLAIM_VALUES) starts later
        started_at = CASE WHEN t.reclaims > 0 OR %(hold)s THEN NULL ELSE %(now)s END
    FROM claimable AS k
    WHERE t.id = k.id
    RETURNING t.id, t.name, t.queue, t.attempt, t.max_attempts, t.failures,
              CASE WHEN coalesce(t.payload_bytes, octet_length(t.payload)) <= %(inline_payload)s
                   THEN t.payload END AS payload,
              t.idempotency_key, t.traceparent, t.shadow, t.created_at, t.enqueued_at, t.generation, t.delivery,
              t.reclaims, t.parent_id, t.parent_generation, t.parent_slot,
              coalesce(t.payload_bytes, octet_length(t.payload)) AS payload_size
), opened AS (
    INSERT INTO dt_attempts (namespace, task_id, generation, attempt, delivery, worker_id, started_at, traceparent)
    SELECT %(namespace)s, c.id, c.generation, c.attempt, c.delivery, %(worker_id)s, %(now)s, p.traceparent
    FROM claimed AS c
    LEFT JOIN unnest(%(trace_ids)b::text[], %(traceparents)b::text[]) AS p (id, traceparent) ON p.id = c.id
), rerun AS MATERIALIZED (
    SELECT c.id FROM claimed AS c WHERE c.attempt > 1 OR c.generation > 0
), previous AS (
    SELECT DISTINCT ON (a.task_id) a.task_id, a.traceparent
    FROM rerun AS r
    JOIN dt_attempts AS a ON a.task_id = r.id
    ORDER BY a.task_id, a.id DESC
), lost AS (
    UPDATE dt_attempts AS a
    SET outcome = 'lost', finished_at = %(now)s, retry_reason = 'lease expired: worker lost'
    FROM rerun AS r
    WHERE a.task_id = r.id AND a.outcome IS NULL
)
SELECT c.*, p.traceparent FROM claimed AS c LEFT JOIN previous AS p ON p.task_id = c.id;

-- name: commit_results
-- Fenced final writes for a batch, and their attempts closed, in one statement: arrays ids,
-- generations, attempts, results. A row is written only while it is RUNNING under the same
-- (generation, attempt); its attempt ends 'succeeded', the others' 'fenced_out'. Returns
-- the ids written. The rows of parent_ids (the children's parents, whose journals the same
-- transaction settles next; usually none) are locked with the batch's, in the same id order.
-- A group larger than statements.PREPARED_GROUP_MAX is planned on every
-- call, never prepared: the rows are found by key once (t.id / a.task_id = ANY(ids)) and
-- joined to the batch, a plan that needs the array's length. A prepared statement's generic
-- plan guesses ten elements and probes ix_dt_attempts_task row by row, each probe testing the
-- whole array again: closing 512 attempts took 100-130 ms instead of 4-8. Joined on the batch
-- alone, without the array, a plan made per call scans the whole index on tables of tens of
-- thousands of rows.
WITH locked AS MATERIALIZED (
    SELECT c.id, c.namespace, c.state, c.generation, c.attempt
    FROM dt_tasks AS c
    WHERE c.id = ANY(%(ids)b::text[] || %(parent_ids)b::text[])
    ORDER BY c.id
    FOR UPDATE OF c
), fenced AS MATERIALIZED (
    SELECT r.id, r.generation, r.attempt, r.result,
           coalesce(l.state = 'RUNNING' AND l.generation = r.generation AND l.attempt = r.attempt
                    AND l.namespace = %(namespace)s, false) AS current
    FROM unnest(%(ids)b::text[], %(generations)b::int[], %(attempts)b::int[], %(results)b::text[])
         AS r (id, generation, attempt, result)
    LEFT JOIN locked AS l ON l.id = r.id
), written AS (
    UPDATE dt_tasks AS t
    SET state = 'SUCCEEDED',
        lease_expires_at = NULL,
        error_type = NULL,
        error_message = NULL,
        finished_at = %(now)s,
        result = f.result
    FROM fenced AS f
    WHERE t.id = ANY(%(ids)b::text[])  -- by primary key: joined on f alone, the planner
      AND t.id = f.id AND f.current    -- hashes a scan of the whole table
    RETURNING t.id
), closed AS (
    UPDATE dt_attempts AS a
    SET outcome = CASE WHEN f.current THEN 'succeeded' ELSE 'fenced_out' END,
        finished_at = %(now)s
    FROM fenced AS f
    WHERE a.task_id = ANY(%(ids)b::text[])  -- by ix_dt_attempts_task, not a scan of the table
      AND a.task_id = f.id AND a.generation = f.generation AND a.attempt = f.attempt
)
SELECT id FROM written;

-- name: renew_leases
-- Extend the leases of running executions: arrays ids, generations, attempts (each row
-- RUNNING under its own generation and attempt). Returns the ids still held.
WITH locked AS MATERIALIZED (
    SELECT c.id, c.namespace, c.state, c.generation, c.attempt
    FROM dt_tasks AS c
    WHERE c.id = ANY(%(ids)b::text[])
    ORDER BY c.id
    FOR UPDATE OF c
)
UPDATE dt_tasks AS t
SET lease_expires_at = %(lease_until)s
FROM locked AS l
JOIN unnest(%(ids)b::text[], %(generations)b::int[], %(attempts)b::int[]) AS f (id, generation, attempt)
  ON f.id = l.id AND f.generation = l.generation AND f.attempt = l.attempt
WHERE t.id = l.id
  AND l.state = 'RUNNING'
  AND l.namespace = %(namespace)s
RETURNING t.id;

-- name: finish_attempts
-- Close attempts with their outcomes: arrays ids (task ids), generations, attempts, outcomes.
UPDATE dt_attempts AS a
SET outcome = f.outcome, finished_at = %(now)s
FROM unnest(%(ids)b::text[], %(generations)b::int[], %(attempts)b::int[], %(outcomes)b::text[])
     AS f (task_id, generation, attempt, outcome)
WHERE a.task_id = f.task_id AND a.generation = f.generation AND a.attempt = f.attempt;

-- name: mark_sent
-- Its transaction commits without waiting for the WAL flush (set_config(..., true) is SET
-- LOCAL without a round trip of its own; an uncorrelated subquery runs once): a mark lost
-- with a crash only means a deduplicated republish.
-- Published outbox rows become SENT (each fenced by its claim token) and their tasks
-- ENQUEUED (only from PENDING/RETRYING in the same generation and delivery: a worker may
-- already run it, and a mark never moves a task backwards). Arrays ids, tokens, stream_ids,
-- partitions (outbox) and task_ids, generations, deliveries. Returns the rows marked SENT.
WITH sent AS (
    UPDATE dt_outbox AS o
    SET state = 'SENT',
        stream_id = s.stream_id,
        "partition" = s.part,
        sent_at = %(now)s,
        lease_expires_at = NULL
    FROM unnest(%(ids)b::bigint[], %(tokens)b::text[], %(stream_ids)b::text[], %(partitions)b::int[])
         AS s (id, token, stream_id, part)
    WHERE o.id = ANY(%(ids)b::bigint[])  -- found by primary key (joined on s.id alone, a hash
      AND o.id = s.id                     -- join over a scan of the whole outbox was planned)
      AND o.claim_token = s.token AND o.state = 'PENDING'
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING o.id
), locked AS MATERIALIZED (
    SELECT c.id, c.state, c.generation, c.delivery
    FROM dt_tasks AS c
    WHERE c.id = ANY(%(task_ids)b::text[])
    ORDER BY c.id
    FOR UPDATE OF c
), enqueued AS (
    UPDATE dt_tasks AS t
    SET state = 'ENQUEUED', enqueued_at = %(now)s
    FROM locked AS l
    JOIN unnest(%(task_ids)b::text[], %(generations)b::int[], %(deliveries)b::int[]) AS d (id, generation, delivery)
      ON d.id = l.id AND d.generation = l.generation AND d.delivery = l.delivery
    WHERE t.id = l.id
      AND l.state IN ('PENDING', 'RETRYING')
)
SELECT count(*) FROM sent;

-- name: claim_outbox
-- Commits without waiting for the WAL flush, as mark_sent does: a lease lost with a crash
-- only means the rows are claimed (and deduplicated) again.
-- Lease up to %(limit)s due PENDING outbox rows (earliest due first, then oldest; rows another
-- dispatcher holds are skipped) and read what publishing needs from their tasks.
-- The plan is pinned by the statement's shape, not left to the statistics:
-- * The namespace is matched with = ANY(%(namespaces)s) (one element) and the rows are
--   ordered by (namespace, next_attempt_at, id). With a plain equality the planner drops the
--   namespace from the ordering; after an ANALYZE that saw the outbox mostly PENDING (a
--   backlog) it preferred the primary key, and every claim walked past all the rows already
--   SENT (O(backlog) per pass). An = ANY on the leading column keeps the ordering, which only
--   ix_dt_outbox_pending_due provides: the claim reads the due entries (~%(limit)s) and stops
--   at the first one not due, however many SENT rows wait for prune and however many delayed
--   rows wait for their time.
-- * The leased ids go to the UPDATE as an array (= ANY(ARRAY(...))), which the primary key
--   looks up; an IN (subquery) was planned as a hash semi-join over a sequential scan of the
--   whole outbox.
-- Every row also carries when the earliest row not due yet will be (next_due's probe, alias
-- n), and a claim of no row returns one row of NULLs with it: a dispatcher that is about to
-- wait learns how long in the same round trip. The probe reads the snapshot the UPDATE
-- started from; the UPDATE leases rows due now and changes no next_attempt_at, so neither
-- sees the other's rows.
WITH leased AS (
UPDATE dt_outbox AS o
SET lease_expires_at = %(lease_until)s,
    claim_token = %(token)s
FROM dt_tasks AS t
WHERE o.id = ANY(ARRAY(
    SELECT d.id
    FROM dt_outbox AS d
    WHERE d.namespace = ANY(%(namespaces)s)
      AND d.state = 'PENDING'
      AND d.id >= %(watermark)s
      AND d.next_attempt_at <= %(now)s
      AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= %(now)s)
    ORDER BY d.namespace, d.next_attempt_at, d.id
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
))
  AND t.id = o.task_id
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
RETURNING o.id, o.task_id, o.queue, o.generation, o.delivery, o.attempts, o.shadow, o.created_at,
          t.name, CASE WHEN coalesce(t.payload_bytes, octet_length(t.payload)) <= %(inline_payload)s
                       THEN t.payload END,
          t.traceparent, t.partition_key, t.priority, t.concurrency_key, t.payload_bytes IS NULL
)
SELECT l.*, n.due
FROM (
    SELECT (
        SELECT w.next_attempt_at
        FROM dt_outbox AS w
        WHERE w.namespace = ANY(%(namespaces)s)
          AND w.state = 'PENDING'
          AND w.next_attempt_at > %(now)s
        ORDER BY w.namespace, w.next_attempt_at
        LIMIT 1
    ) AS due
) AS n
LEFT JOIN leased AS l ON true;

-- name: next_due
-- When the earliest PENDING outbox row that is not due yet will be (no row: none is waiting):
-- the dispatcher sleeps until then. The first entry of ix_dt_outbox_pending_due past now, one
-- probe of the index however many rows wait.
SELECT d.next_attempt_at
FROM dt_outbox AS d
WHERE d.namespace = ANY(%(namespaces)s)
  AND d.state = 'PENDING'
  AND d.next_attempt_at > %(now)s
ORDER BY d.namespace, d.next_attempt_at
LIMIT 1;

-- name: submit_task
-- A new task, its first outbox row (due at %(due)s: now, or later for a delayed task) and the
-- dispatchers' wake-up, in one statement (one round trip inside the caller's transaction). A duplicate (namespace, name, idempotency_key)
-- inserts nothing and returns no row: the caller then reads the existing task.
WITH task AS (
    INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, payload_bytes, state, generation,
                          attempt, delivery, reclaims, counted_losses, failures, max_attempts, traceparent,
                          partition_key, priority, concurrency_key, shadow, parent_id, parent_generation,
                          parent_slot, created_at)
    VALUES (%(id)s, %(namespace)s, %(name)s, %(queue)s, %(idempotency_key)s, %(payload)s, %(payload_bytes)s,
            'PENDING', 0, 0,
            0, 0, 0, 0, %(max_attempts)s, %(traceparent)s, %(partition_key)s, %(priority)s, %(concurrency_key)s,
            %(shadow)s, %(parent_id)s, %(parent_generation)s, %(parent_slot)s, %(now)s)
    ON CONFLICT (namespace, name, idempotency_key) DO NOTHING
    RETURNING id
), intent AS (
    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    SELECT %(namespace)s, task.id, %(queue)s, 0, 0, 'PENDING', 0, %(due)s, %(shadow)s, %(now)s
    FROM task
)
SELECT task.id, pg_notify(%(channel)s, %(namespace)s) FROM task;

-- name: submit_tasks
-- A batch of new tasks of one name, their first outbox rows and the dispatchers' wake-up, in
-- one statement (one round trip inside the caller's transaction): arrays ids, keys, payloads,
-- traceparents, partition_keys, dues, one element per task in submit order. Returns one row
-- per task, in that order: the id of the task that holds it, whether this statement created
-- it, and its generation. A key already taken (committed, earlier in this transaction, or
-- earlier in this batch) inserts nothing and names the task that holds it. A key committed by
-- another transaction after this statement began is not visible to it: that row comes back
-- with a NULL id, and the caller reads the key again (ON CONFLICT waited for that commit).
WITH given AS (
    SELECT g.id, g.idempotency_key, g.payload, g.payload_bytes, g.traceparent, g.partition_key, g.due, g.ord
    FROM unnest(%(ids)b::text[], %(keys)b::text[], %(payloads)b::text[], %(payload_sizes)b::int[],
                %(traceparents)b::text[], %(partition_keys)b::text[], %(dues)b::timestamptz[]) WITH ORDINALITY
         AS g (id, idempotency_key, payload, payload_bytes, traceparent, partition_key, due, ord)
), task AS (
    INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, payload_bytes, state, generation,
                          attempt, delivery, reclaims, counted_losses, failures, max_attempts, traceparent,
                          partition_key, priority, concurrency_key, shadow, created_at)
    SELECT g.id, %(namespace)s, %(name)s, %(queue)s, g.idempotency_key, g.payload, g.payload_bytes, 'PENDING', 0, 0,
           0, 0, 0, 0, %(max_attempts)s, g.traceparent, g.partition_key, %(priority)s, %(concurrency_key)s,
           %(shadow)s, %(now)s
    FROM given AS g
    ORDER BY g.idempotency_key, g.ord  -- keys in one order: two batches sharing keys never deadlock
    ON CONFLICT (namespace, name, idempotency_key) DO NOTHING
    RETURNING id, idempotency_key
), intent AS (
    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    SELECT %(namespace)s, task.id, %(queue)s, 0, 0, 'PENDING', 0, g.due, %(shadow)s, %(now)s
    FROM task JOIN given AS g ON g.id = task.id
    ORDER BY g.ord
)
SELECT coalesce(mine.id, twin.id, held.id), mine.id IS NOT NULL, coalesce(held.generation, 0),
       pg_notify(%(channel)s, %(namespace)s)
FROM given AS g
LEFT JOIN task AS mine ON mine.id = g.id
LEFT JOIN task AS twin ON mine.id IS NULL AND twin.idempotency_key = g.idempotency_key
LEFT JOIN dt_tasks AS held ON mine.id IS NULL AND twin.id IS NULL AND held.namespace = %(namespace)s
     AND held.name = %(name)s AND held.idempotency_key = g.idempotency_key
ORDER BY g.ord;

-- name: submit_children
-- A suspension's new children, their first outbox rows and the dispatchers' wake-up, in one
-- statement inside the suspension's fenced transaction: one row per child, in the given
-- order. Per child (arrays): ids, names, queues, keys, payloads, max_attempts, priorities,
-- slots, dues; the rest is the parent's (namespace, traceparent, shadow, parent_id,
-- parent_generation). Returns (id of the task holding the key or NULL, created,
-- generation). A key already taken (the child of an earlier try of this suspension) inserts
-- nothing and names its task, found by the key's unique index. A key committed by another
-- transaction after this statement began is not visible to it: NULL, and the caller reads
-- the key again.
WITH given AS (
    SELECT g.id, g.name, g.queue, g.idempotency_key, g.payload, g.payload_bytes, g.max_attempts, g.priority,
           g.parent_slot, g.due, g.ord
    FROM unnest(%(ids)b::text[], %(names)b::text[], %(queues)b::text[], %(keys)b::text[], %(payloads)b::text[],
                %(payload_sizes)b::int[], %(max_attempts)b::int[], %(priorities)b::int[], %(slots)b::text[],
                %(dues)b::timestamptz[])
         WITH ORDINALITY
         AS g (id, name, queue, idempotency_key, payload, payload_bytes, max_attempts, priority, parent_slot, due,
               ord)
), task AS (
    INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, payload_bytes, state, generation,
                          attempt, delivery, reclaims, counted_losses, failures, max_attempts, traceparent,
                          priority, shadow, parent_id, parent_generation, parent_slot, created_at)
    SELECT g.id, %(namespace)s, g.name, g.queue, g.idempotency_key, g.payload, g.payload_bytes, 'PENDING', 0, 0,
           0, 0, 0, 0, g.max_attempts, %(traceparent)s, g.priority, %(shadow)s, %(parent_id)s,
           %(parent_generation)s, g.parent_slot, %(now)s
    FROM given AS g
    ORDER BY g.ord
    ON CONFLICT (namespace, name, idempotency_key) DO NOTHING
    RETURNING id
), intent AS (
    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    SELECT %(namespace)s, task.id, g.queue, 0, 0, 'PENDING', 0, g.due, %(shadow)s, %(now)s
    FROM task JOIN given AS g ON g.id = task.id
    ORDER BY g.ord
)
SELECT coalesce(mine.id, held.id), mine.id IS NOT NULL, coalesce(held.generation, 0),
       pg_notify(%(channel)s, %(namespace)s)
FROM given AS g
LEFT JOIN task AS mine ON mine.id = g.id
LEFT JOIN dt_tasks AS held ON mine.id IS NULL AND held.namespace = %(namespace)s
     AND held.name = g.name AND held.idempotency_key = g.idempotency_key
ORDER BY g.ord;

-- name: suspend_on_children
-- A suspension that waits on children alone, in one statement (store/journal.py's suspend:
-- wait_fenced, then submit_children, then the waits' rows): the attempt's fence moves the task
-- to WAITING and closes the attempt as suspended; the children, their outbox rows and the
-- dispatchers' wake-up are written as submit_children writes them (key order aside: the fence
-- serializes the suspensions of one task); each child's wait opens in its slot, unless the
-- slot has a row (a child found rather than created: an earlier suspension's). Nothing is
-- written when the fence does not hold, and no row comes back. One row per child, in order:
-- (id of the task holding its key, created, generation).
WITH waiting AS (
    UPDATE dt_tasks AS t
    SET state = 'WAITING', lease_expires_at = NULL
    WHERE t.id = %(task_id)s AND (t.namespace || '') = %(namespace)s::text AND t.generation = %(generation)s
      AND t.attempt = %(attempt)s AND (t.state || '') = 'RUNNING'
    RETURNING t.id
), closed AS (
    UPDATE dt_attempts AS a
    SET outcome = %(outcome)s, finished_at = %(now)s
    WHERE a.task_id = %(task_id)s AND a.generation = %(generation)s AND a.attempt = %(attempt)s
      AND EXISTS (SELECT 1 FROM waiting)
), given AS (
    SELECT g.id, g.name, g.queue, g.idempotency_key, g.payload, g.payload_bytes, g.max_attempts, g.priority,
           g.parent_slot, g.label, g.due, g.ord
    FROM unnest(%(ids)b::text[], %(names)b::text[], %(queues)b::text[], %(keys)b::text[], %(payloads)b::text[],
                %(payload_sizes)b::int[], %(max_attempts)b::int[], %(priorities)b::int[], %(slots)b::text[],
                %(labels)b::text[], %(dues)b::timestamptz[]) WITH ORDINALITY
         AS g (id, name, queue, idempotency_key, payload, payload_bytes, max_attempts, priority, parent_slot, label,
               due, ord)
    WHERE EXISTS (SELECT 1 FROM waiting)
), task AS (
    INSERT INTO dt_tasks (id, namespace, name, queue, idempotency_key, payload, payload_bytes, state, generation,
                          attempt, delivery, reclaims, counted_losses, failures, max_attempts, traceparent,
                          priority, shadow, parent_id, parent_generation, parent_slot, created_at)
    SELECT g.id, %(namespace)s, g.name, g.queue, g.idempotency_key, g.payload, g.payload_bytes, 'PENDING', 0, 0,
           0, 0, 0, 0, g.max_attempts, %(traceparent)s, g.priority, %(shadow)s, %(task_id)s,
           %(generation)s, g.parent_slot, %(now)s
    FROM given AS g
    ORDER BY g.ord
    ON CONFLICT (namespace, name, idempotency_key) DO NOTHING
    RETURNING id
), intent AS (
    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    SELECT %(namespace)s, task.id, g.queue, 0, 0, 'PENDING', 0, g.due, %(shadow)s, %(now)s
    FROM task JOIN given AS g ON g.id = task.id
    ORDER BY g.ord
), child AS MATERIALIZED (
    SELECT g.ord, g.parent_slot AS slot, g.label, coalesce(mine.id, held.id) AS id, mine.id IS NOT NULL AS created,
           coalesce(held.generation, 0) AS generation
    FROM given AS g
    LEFT JOIN task AS mine ON mine.id = g.id
    LEFT JOIN dt_tasks AS held ON mine.id IS NULL AND held.namespace = %(namespace)s
         AND held.name = g.name AND held.idempotency_key = g.idempotency_key
), opened AS (
    INSERT INTO dt_steps (namespace, task_id, generation, slot, kind, label, done, child_task_id, created_at)
    SELECT %(namespace)s, %(task_id)s, %(generation)s, c.slot, 'child', c.label, false, c.id, %(now)s
    FROM child AS c
    WHERE c.id IS NOT NULL
    ORDER BY c.ord
    ON CONFLICT (task_id, generation, slot) DO NOTHING
)
SELECT c.id, c.created, c.generation, pg_notify(%(channel)s, %(namespace)s)
FROM child AS c
ORDER BY c.ord;

-- name: redeliver_lost
-- Supersede lost deliveries nobody holds, each with the next one (store/recovery.py's
-- redeliver_many in one statement): arrays ids, generations, deliveries; count_reclaim (a
-- worker lost them, not Redis: reclaims + 1 for an attempt that had started, and
-- counted_losses + 1 for one that ran alone: policy.loss_suspects, policy.loss_counts);
-- reason (of the attempts closed as lost). Returns (id, generation, delivery) of each
-- delivery superseded, as it was named. The runtime's transactions plan with sequential scans
-- priced out (store/postgres/planner.py): each row of taken is one probe of a primary key or
-- of ix_dt_attempts_task. (An "id = ANY(ids)" beside the join would be tested against the
-- whole array on every probe: a page of 500 then took a second.)
WITH locked AS MATERIALIZED (
    SELECT c.id, c.namespace, c.state, c.generation, c.delivery, c.lease_expires_at, c.attempt, c.solo_attempt,
           c.started_at, c.queue, c.shadow
    FROM dt_tasks AS c
    WHERE c.id = ANY(%(ids)b::text[])
    ORDER BY c.id
    FOR UPDATE OF c
), taken AS MATERIALIZED (
    SELECT DISTINCT l.id, l.generation, l.delivery, l.queue, l.shadow,
           (%(count_reclaim)s AND l.state = 'RUNNING' AND l.solo_attempt = l.attempt) AS charged,
           (%(count_reclaim)s AND l.state = 'RUNNING' AND l.started_at IS NOT NULL) AS suspected
    FROM locked AS l
    JOIN unnest(%(ids)b::text[], %(generations)b::int[], %(deliveries)b::int[]) AS d (id, generation, delivery)
      ON d.id = l.id AND d.generation = l.generation AND d.delivery = l.delivery
    WHERE l.namespace = %(namespace)s
      AND l.state NOT IN ('SUCCEEDED', 'FAILED', 'DEAD', 'CANCELLED', 'WAITING')  -- recovery.py's _OWE_NO_ENTRY
      AND (l.state <> 'RUNNING' OR l.lease_expires_at IS NULL OR l.lease_expires_at <= %(now)s)
), moved AS (
    UPDATE dt_tasks AS t
    SET state = 'PENDING',
        delivery = t.delivery + 1,
        reclaims = t.reclaims + CASE WHEN k.suspected THEN 1 ELSE 0 END,
        counted_losses = t.counted_losses + CASE WHEN k.charged THEN 1 ELSE 0 END,
        lease_expires_at = NULL
    FROM taken AS k
    WHERE t.id = k.id
    RETURNING t.id, t.generation, t.delivery - 1
), closed AS (
    UPDATE dt_attempts AS a
    SET outcome = 'lost', finished_at = %(now)s, retry_reason = %(reason)s
    FROM taken AS k
    WHERE a.task_id = k.id AND a.generation = k.generation AND a.outcome IS NULL
), opened AS (
    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at, shadow,
                           created_at)
    SELECT %(namespace)s, k.id, k.queue, k.generation, k.delivery + 1, 'PENDING', 0, %(now)s, k.shadow, %(now)s
    FROM taken AS k
    ORDER BY k.id
)
SELECT * FROM moved;

-- name: resume_if_ready
-- store/journal.py's resume_if_ready in one statement (the caller holds the task row's lock):
-- a WAITING task none of whose waits in this generation is open any more becomes PENDING as a
-- new delivery of the same generation, with that delivery's outbox row and the dispatchers'
-- wake-up. Returns the new delivery (store/outbox.py's NewDelivery, in its field order), or no
-- row. With a %(slot)s, store/journal.py's settle_child: that open wait is first settled with a
-- child's outcome (state, result, error_type, error_message), and the task resumes only if it
-- was (the statement's own snapshot still shows that wait open: it is left out of the test).
-- The row is found by key alone and its state tested after: with statistics taken while
-- few tasks waited, `state = 'WAITING'` in the UPDATE's WHERE was planned as a search of
-- ix_dt_tasks_state, every waiting task of the namespace per resume.
WITH settled AS (
    UPDATE dt_steps AS s
    SET done = true,
        child_state = %(state)s,
        result = %(result)s,
        error_type = %(error_type)s,
        error_message = %(error_message)s,
        finished_at = %(now)s
    WHERE %(slot)s::text IS NOT NULL
      AND s.task_id = %(task_id)s AND s.generation = %(generation)s AND s.slot = %(slot)s::text
      AND s.done IS FALSE
    RETURNING s.id
), found AS MATERIALIZED (
    SELECT c.id, c.namespace, c.state, c.generation
    FROM dt_tasks AS c
    WHERE c.id = %(task_id)s
    FOR UPDATE OF c
), resumed AS (
    UPDATE dt_tasks AS t
    SET state = 'PENDING', delivery = t.delivery + 1, lease_expires_at = NULL, worker_id = NULL
    FROM found AS f
    WHERE t.id = %(task_id)s AND t.id = f.id
      AND f.namespace = %(namespace)s AND f.generation = %(generation)s AND f.state = 'WAITING'
      AND (%(slot)s::text IS NULL OR EXISTS (SELECT 1 FROM settled))
      AND NOT EXISTS (
          SELECT 1 FROM dt_steps AS s
          WHERE s.task_id = %(task_id)s AND s.generation = %(generation)s AND s.done IS FALSE
            AND s.slot IS DISTINCT FROM %(slot)s::text
      )
    RETURNING t.id, t.name, t.queue, t.generation, t.delivery, t.shadow, t.traceparent, t.partition_key,
              t.priority, t.concurrency_key
), intent AS (
    INSERT INTO dt_outbox (namespace, task_id, queue, generation, delivery, state, attempts, next_attempt_at,
                           shadow, created_at)
    SELECT %(namespace)s, r.id, r.queue, r.generation, r.delivery, 'PENDING', 0, %(now)s, r.shadow, %(now)s
    FROM resumed AS r
)
SELECT r.*, pg_notify(%(channel)s, %(namespace)s) FROM resumed AS r;

-- name: record_step
-- store/journal.py's record_step in one statement: the attempt's fence (an UPDATE that extends
-- its lease and locks the task row, found by key, namespace and state tested on it) and the
-- step's row unless its slot has one. Returns whether the fence held, whether the row was
-- inserted, and the slot's result as the statement's snapshot saw it (a row already there
-- wins). A slot's row committed by another transaction after that snapshot makes the insert
-- do nothing (ON CONFLICT) and is not seen here: the caller reads the slot again.
WITH owned AS (
    UPDATE dt_tasks AS t
    SET lease_expires_at = %(lease_until)s
    WHERE t.id = %(task_id)s AND (t.namespace || '') = %(namespace)s::text AND t.generation = %(generation)s
      AND t.attempt = %(attempt)s AND (t.state || '') = 'RUNNING'
    RETURNING t.id
), recorded AS (
    INSERT INTO dt_steps (namespace, task_id, generation, slot, kind, label, done, result, created_at, finished_at)
    SELECT %(namespace)s::text, o.id, %(generation)s, %(slot)s::text, %(kind)s, %(label)s, true, %(result)s,
           %(now)s, %(now)s
    FROM owned AS o
    WHERE NOT EXISTS (
        SELECT 1 FROM dt_steps AS s
        WHERE s.task_id = %(task_id)s AND s.generation = %(generation)s AND s.slot = %(slot)s::text
    )
    ON CONFLICT (task_id, generation, slot) DO NOTHING
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM owned), EXISTS (SELECT 1 FROM recorded),
       (SELECT s.result FROM dt_steps AS s
        WHERE s.task_id = %(task_id)s AND s.generation = %(generation)s AND s.slot = %(slot)s::text);

-- name: wait_fenced
-- store/journal.py's wait_fenced in one statement, a suspension's start: the attempt's fence
-- (the row found by key, namespace and state tested on it) moves the task to WAITING without a
-- lease, and the attempt is closed as suspended. Returns a row when the fence held.
WITH waiting AS (
    UPDATE dt_tasks AS t
    SET state = 'WAITING', lease_expires_at = NULL
    WHERE t.id = %(task_id)s AND (t.namespace || '') = %(namespace)s::text AND t.generation = %(generation)s
      AND t.attempt = %(attempt)s AND (t.state || '') = 'RUNNING'
    RETURNING t.id
), closed AS (
    UPDATE dt_attempts AS a
    SET outcome = %(outcome)s, finished_at = %(now)s
    WHERE a.task_id = %(task_id)s AND a.generation = %(generation)s AND a.attempt = %(attempt)s
      AND EXISTS (SELECT 1 FROM waiting)
)
SELECT id FROM waiting;
