-- The JSON that users hand over and get back (payloads, results, journal steps, agent runs and
-- turns) as MEDIUMTEXT, up to 16 MiB: TEXT holds 65,535 bytes, less than a payload may have
-- (DT_MAX_PAYLOAD_BYTES, 1 MiB by default). Older code reads and writes these columns as before.
-- InnoDB can only copy a table to change a column's type, and the table's writes wait meanwhile
-- (about 10 s a million tasks): docs/upgrading.md says how to run it on a large dt_tasks. On
-- columns already MEDIUMTEXT (changed by an online schema change tool) each ALTER returns at once.

ALTER TABLE dt_tasks MODIFY payload MEDIUMTEXT NOT NULL, MODIFY result MEDIUMTEXT;
ALTER TABLE dt_steps MODIFY result MEDIUMTEXT, MODIFY request MEDIUMTEXT;
ALTER TABLE dt_agent_runs MODIFY input MEDIUMTEXT NOT NULL, MODIFY output MEDIUMTEXT;
ALTER TABLE dt_agent_turns MODIFY output MEDIUMTEXT NOT NULL, MODIFY calls MEDIUMTEXT NOT NULL,
    MODIFY tool_results MEDIUMTEXT;
