-- A fleet directory read into tables (docs/fleet.md, "Tables"): the statements
-- pagedkv_sql.fleet.tables runs, file by file; sql/fleet.sql derives and checks.

-- name: fleet_tables
-- The input relations (docs/fleet.md, "Tables"), created empty; fleet.tables fills them.
-- Plan: none (DDL).
CREATE OR REPLACE TABLE fleet_meta (step_seconds DOUBLE, block_size BIGINT, hash_fold VARCHAR, t_end DOUBLE, sample DOUBLE);
CREATE OR REPLACE TABLE fleet_replica (replica VARCHAR, worker_id BIGINT, dp_rank BIGINT, num_gpu_blocks BIGINT);
CREATE OR REPLACE TABLE fleet_router (router VARCHAR, kind VARCHAR, routed BOOLEAN, approximate BOOLEAN);
CREATE OR REPLACE TABLE fleet_batch (replica VARCHAR, dp_rank BIGINT, seq BIGINT, ts DOUBLE, line BIGINT);
CREATE OR REPLACE TABLE fleet_event (replica VARCHAR, dp_rank BIGINT, seq BIGINT, ts DOUBLE, pos BIGINT, kind VARCHAR, grp BIGINT, medium VARCHAR, hash BIGINT, parent BIGINT);
CREATE OR REPLACE TABLE fleet_step_op (replica VARCHAR, step BIGINT, event BIGINT, op VARCHAR, grp BIGINT, block_id BIGINT, hash BIGINT);
CREATE OR REPLACE TABLE fleet_dump (router VARCHAR, t DOUBLE, replica VARCHAR, dp_rank BIGINT, tier VARCHAR, hash BIGINT);
CREATE OR REPLACE TABLE fleet_dump_time (router VARCHAR, t DOUBLE);
CREATE OR REPLACE TABLE fleet_decision (request VARCHAR, router VARCHAR, t DOUBLE, chosen VARCHAR, reason VARCHAR, routed BOOLEAN, prompt_tokens BIGINT);
CREATE OR REPLACE TABLE fleet_prediction (request VARCHAR, router VARCHAR, replica VARCHAR, blocks BIGINT);
CREATE OR REPLACE TABLE fleet_request_hash (request VARCHAR, pos BIGINT, hash BIGINT);
CREATE OR REPLACE TABLE fleet_outcome (request VARCHAR, replica VARCHAR, t DOUBLE, prompt_tokens BIGINT, cached_tokens BIGINT);
CREATE OR REPLACE TABLE fleet_lag (lag DOUBLE);
CREATE OR REPLACE TABLE fleet_group (grp BIGINT, kind VARCHAR);

-- name: fleet_event_lines
-- A JSON Lines file (a replica's events, one KVEventBatch a line, or its step log) read
-- whole by DuckDB's JSON reader, each line kept with its number. Parameter: $file.
-- Plan: one scan of the file; a row number in file order.
CREATE OR REPLACE TEMP TABLE fleet_json_lines AS
SELECT row_number() OVER () AS line, json AS j FROM read_ndjson_objects($file);

-- name: fleet_event_problem
-- The first line of fleet_json_lines that is not a KVEventBatch, and why (DuckDB's reader
-- takes any JSON object; this names the line, run when fleet_event_odd says so).
-- Plan: one scan of fleet_json_lines, stopped at the first problem.
SELECT line, CASE
    WHEN json_type(j, '$.seq') NOT IN ('UBIGINT', 'BIGINT') OR json_type(j, '$.seq') IS NULL
        THEN 'a batch needs its sequence number "seq" (an integer)'
    WHEN json_type(j, '$.events') IS DISTINCT FROM 'ARRAY'
        THEN 'a batch needs "events", a list of events in vLLM''s field order'
    WHEN json_type(j, '$.ts') NOT IN ('UBIGINT', 'BIGINT', 'DOUBLE') OR json_type(j, '$.ts') IS NULL
        THEN 'a batch needs its time "ts" (seconds)'
    WHEN EXISTS (SELECT 1 FROM unnest(json_extract(j, '$.events[*]')) AS u(e)
                 WHERE CASE WHEN json_type(e) = 'OBJECT'
                            THEN json_type(e, '$.type') IS DISTINCT FROM 'VARCHAR'
                              OR (e->>'$.type' IN ('BlockStored', 'BlockRemoved')
                                  AND json_type(e, '$.block_hashes') IS DISTINCT FROM 'ARRAY')
                            ELSE json_type(e) <> 'ARRAY'
                              OR json_type(e, '$[0]') IS DISTINCT FROM 'VARCHAR'
                              OR (e->>'$[0]' IN ('BlockStored', 'BlockRemoved')
                                  AND json_type(e, '$[1]') IS DISTINCT FROM 'ARRAY') END)
        THEN 'an event must be vLLM''s [kind, hashes, ...] or {"type", "block_hashes", ...}'
    END AS problem
FROM fleet_json_lines WHERE problem IS NOT NULL ORDER BY line LIMIT 1;

-- name: fleet_event_odd
-- Whether the rows of one replica's events file hold anything fleet_event_problem would
-- name (a batch without its number or time, an event without its kind or hashes).
-- Parameter: $replica.
-- Plan: one scan of the replica's rows of fleet_batch and fleet_event.
SELECT EXISTS (SELECT 1 FROM fleet_batch WHERE replica = $replica AND (seq IS NULL OR ts IS NULL))
    OR EXISTS (SELECT 1 FROM fleet_json_lines WHERE json_type(j, '$.events') IS DISTINCT FROM 'ARRAY')
    OR EXISTS (SELECT 1 FROM fleet_event WHERE replica = $replica
               AND (kind IS NULL OR (kind IN ('stored', 'removed') AND hash IS NULL)));

-- name: fleet_event_batches
-- The lines of fleet_json_lines as batches (replica, rank, sequence number, time).
-- Parameter: $replica.
-- Plan: one scan of fleet_json_lines.
INSERT INTO fleet_batch
SELECT $replica, coalesce((j->>'$.data_parallel_rank')::BIGINT, 0), (j->>'$.seq')::BIGINT,
       round((j->>'$.ts')::DOUBLE, 9), line
FROM fleet_json_lines;

-- name: fleet_event_rows
-- The events of fleet_json_lines, one row a hash (AllBlocksCleared: one row, no hash), in
-- vLLM's array field order (BlockStored: hashes 1, parent 2, medium 6, group 9;
-- BlockRemoved: hashes 1, medium 2, group 3) or its JSON object form (`type`,
-- `block_hashes`, `parent_block_hash`, `medium`, `group_idx`); hashes folded to signed.
-- Parameter: $replica.
-- Plan: one scan of fleet_json_lines, an unnest of each batch's events and of each
-- event's hashes; no join.
INSERT INTO fleet_event
WITH ev AS (
    SELECT line, coalesce((j->>'$.data_parallel_rank')::BIGINT, 0) AS dp_rank,
           (j->>'$.seq')::BIGINT AS seq, round((j->>'$.ts')::DOUBLE, 9) AS ts,
           unnest(json_extract(j, '$.events[*]')) AS e,
           generate_subscripts(json_extract(j, '$.events[*]'), 1) AS pos
    FROM fleet_json_lines
), tagged AS (  -- vLLM's array form, or its msgspec JSON object form (tagged by "type")
    SELECT *, json_type(e) = 'OBJECT' AS obj,
           CASE WHEN json_type(e) = 'OBJECT' THEN e->>'$.type' ELSE e->>'$[0]' END AS tag
    FROM ev
), typed AS (
    SELECT dp_rank, seq, ts, pos, tag,
           CASE WHEN obj THEN e->>'$.medium' WHEN tag = 'BlockStored' THEN e->>'$[6]'
                WHEN tag = 'BlockRemoved' THEN e->>'$[2]' END AS medium,
           coalesce(CASE WHEN obj THEN (e->>'$.group_idx')::BIGINT
                         WHEN tag = 'BlockStored' THEN (e->>'$[9]')::BIGINT
                         WHEN tag = 'BlockRemoved' THEN (e->>'$[3]')::BIGINT END, 0) AS grp,
           CASE WHEN tag <> 'BlockStored' THEN NULL WHEN obj THEN (e->>'$.parent_block_hash')::HUGEINT
                ELSE (e->>'$[2]')::HUGEINT END AS parent,
           CASE WHEN tag NOT IN ('BlockStored', 'BlockRemoved') THEN [NULL]
                WHEN obj THEN json_extract_string(e, '$.block_hashes[*]')
                ELSE json_extract_string(e, '$[1][*]') END AS hashes
    FROM tagged
), one AS (
    SELECT dp_rank, seq, ts, pos, tag, medium, grp, parent, unnest(hashes)::HUGEINT AS h FROM typed
)
SELECT $replica, dp_rank, seq, ts, pos,
       CASE tag WHEN 'BlockStored' THEN 'stored' WHEN 'BlockRemoved' THEN 'removed'
                WHEN 'AllBlocksCleared' THEN 'cleared' ELSE lower(tag) END,
       grp, medium,
       (h - CASE WHEN h >= 9223372036854775808 THEN 18446744073709551616 ELSE 0 END)::BIGINT,
       (parent - CASE WHEN parent >= 9223372036854775808 THEN 18446744073709551616 ELSE 0 END)::BIGINT
FROM one;

-- name: fleet_step_ops
-- One replica's step log (JSON Lines: the header, then one step a line) read by DuckDB's
-- JSON reader: its `cache` and `evict` ops, one row a block (a cache's hash beside its
-- block: 16 hex digits, as signed BIGINT), and the `allocate` ops that name a KV-cache
-- group (a block's group, in one pool), into fleet_step_op; other ops and lines without
-- a step (a recorder's marks) skipped; the file read by fleet_event_lines. Parameter:
-- $replica.
-- Plan: one scan of fleet_json_lines, an unnest of each step's ops and of each op's blocks.
INSERT INTO fleet_step_op
WITH l AS (SELECT line, j FROM fleet_json_lines), o AS (
    SELECT line, (j->>'$.step')::BIGINT AS step, unnest(json_extract(j, '$.ops[*]')) AS o,
           generate_subscripts(json_extract(j, '$.ops[*]'), 1) AS k
    FROM l WHERE line > 1 AND json_type(j, '$.step') IS NOT NULL
), b AS (
    SELECT step, line * 1000000 + k AS event, o->>'$.op' AS op,
           coalesce((o->>'$.group')::BIGINT, 0) AS grp,
           unnest(json_extract_string(o, '$.blocks[*]'))::BIGINT AS block_id,
           unnest(CASE WHEN o->>'$.op' = 'cache' THEN json_extract_string(o, '$.hashes[*]')
                       ELSE [NULL] END) AS hx
    FROM o WHERE o->>'$.op' IN ('cache', 'evict')
               OR (o->>'$.op' = 'allocate' AND json_type(o, '$.group') IS NOT NULL)
)
SELECT $replica, step, event, op, grp, block_id,
       CASE WHEN hx IS NOT NULL THEN (('0x' || hx)::UBIGINT::HUGEINT
            - CASE WHEN ('0x' || hx)::UBIGINT >= 9223372036854775808 THEN 18446744073709551616 ELSE 0 END)::BIGINT END
FROM b WHERE block_id IS NOT NULL OR op <> 'allocate';

-- name: fleet_step_odd
-- Whether one replica's step ops hold anything fleet_step_problem would name (a cached
-- block without its hash). Parameter: $replica.
-- Plan: one scan of the replica's rows of fleet_step_op.
SELECT EXISTS (SELECT 1 FROM fleet_step_op WHERE replica = $replica AND op = 'cache'
               AND (hash IS NULL OR block_id IS NULL));

-- name: fleet_step_problem
-- The first line of a step log whose `cache` or `evict` op fleet_step_ops cannot take (a
-- cache without one hash of 16 hex digits a block, blocks that are not a list), and why.
-- The file read by fleet_event_lines.
-- Plan: one scan of fleet_json_lines, an unnest of each step's ops, stopped at the first
-- problem.
WITH l AS (SELECT line, j FROM fleet_json_lines), o AS (
    SELECT line, unnest(json_extract(j, '$.ops[*]')) AS o
    FROM l WHERE line > 1 AND json_type(j, '$.ops') = 'ARRAY'
)
SELECT line, CASE
    WHEN json_type(o, '$.blocks') IS DISTINCT FROM 'ARRAY' THEN o->>'$.op' || ' needs its blocks as a list'
    WHEN o->>'$.op' = 'evict' THEN NULL
    WHEN json_type(o, '$.hashes') IS DISTINCT FROM 'ARRAY'
      OR json_array_length(o, '$.hashes') <> json_array_length(o, '$.blocks')
        THEN 'cache needs ''hashes'', one a block'
    WHEN EXISTS (SELECT 1 FROM unnest(json_extract_string(o, '$.hashes[*]')) AS u(h)
                 WHERE h IS NULL OR NOT regexp_full_match(h, '[0-9a-fA-F]{16}'))
        THEN 'a cached block''s hash must be 16 hex digits'
    END AS problem
FROM o WHERE o->>'$.op' IN ('cache', 'evict') AND problem IS NOT NULL ORDER BY line LIMIT 1;
