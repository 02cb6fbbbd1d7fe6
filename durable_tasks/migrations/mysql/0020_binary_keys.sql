-- The journal's slots (a step's label, a signal's name), a child task's slot and id on its
-- parent's side, and the agent records' ids and namespace compare byte for byte, as task ids,
-- names and idempotency keys have from version 1 (utf8mb4_bin; namespaces ascii_bin). In the
-- table's default collation, which ignores case and accents, journal.step("Search") and
-- journal.step("search") were one row (the second returned the first's result), and the signal
-- "deploy" answered a wait for "Deploy". A binary collation tells apart every pair of values the
-- old one did, so the unique keys hold on the rows there are; like every utf8mb4_bin column these
-- still ignore trailing spaces. Older code reads and writes the columns as before.
-- On MariaDB 10.11: dt_tasks.parent_slot and dt_steps.child_task_id are in no index, and their
-- collation changes without rewriting a row (INSTANT); dt_steps.slot and dt_agent_turns.run_id
-- have their indexes rebuilt in place while writes go on (NOCOPY); dt_agent_runs is copied, its
-- writes waiting meanwhile (one row per agent run): its primary key changes collation and its
-- namespace becomes ASCII (the namespace pattern allows nothing else). A column already changed
-- (by an online schema change tool) is left as it is.

ALTER TABLE dt_tasks MODIFY parent_slot VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

ALTER TABLE dt_steps
    MODIFY slot VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    MODIFY child_task_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

ALTER TABLE dt_agent_runs
    MODIFY id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    MODIFY namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL;

ALTER TABLE dt_agent_turns MODIFY run_id VARCHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
