-- Queries behind `map` and `report` (pagedkv_sql/report/). Read-only: they create
-- nothing, so a database opened read-only can be drawn. The core never runs them.
-- A sequence's owner of a block table is the smallest seq_id whose root_table row points
-- to it (diag_conflicting_root names the others); a block whose holders have no
-- root_table row at all is leaked (diag_orphan_block_table).

-- name: report_gpu_rows
-- The rows of block_table_entry: report/data.py folds them into one entry per base (its
-- holders, owner, mismatch) with one sort, cheaper than a hash aggregate of every base.
SELECT block_table_id, block_index, physical_block_base, refcount FROM block_table_entry;

-- name: report_owners
-- The owner of each block table: the smallest seq_id whose root_table row points to it
-- (diag_conflicting_root names the others), in block_table_ptr order.
SELECT block_table_ptr, min(seq_id) AS seq_id FROM root_table GROUP BY ALL ORDER BY ALL;

-- name: report_cpu_blocks
-- One row per distinct CPU address of a swapped block, in address order: its owner
-- (-1: none) and whether every block table holding it is an orphan (leaked CPU memory).
-- Plan: one hash aggregate of swapped_block joined to the small root_table.
WITH owners AS (
    SELECT block_table_ptr, min(seq_id) AS seq_id FROM root_table GROUP BY ALL
)
SELECT s.cpu_base_address AS address,
       count(DISTINCT (s.block_table_id, s.block_index)) AS holders,
       coalesce(min(o.seq_id), -1) AS seq_id,
       bool_and(o.seq_id IS NULL) AS orphan
FROM swapped_block s LEFT JOIN owners o ON o.block_table_ptr = s.block_table_id
GROUP BY s.cpu_base_address
ORDER BY address;

-- name: report_roots
-- The block tables of the sequences, one row each (exact duplicates are one fact), in
-- block_table_ptr order.
SELECT DISTINCT seq_id, block_table_ptr FROM root_table ORDER BY block_table_ptr, seq_id;

-- name: report_swapped_slots
-- The CPU entries of the block tables that sequences point to, in the strips' range of
-- block indexes (the parameter is the largest one drawn).
SELECT DISTINCT block_table_id, block_index
FROM swapped_block
SEMI JOIN root_table r ON r.block_table_ptr = block_table_id
WHERE block_index BETWEEN 0 AND ?;

-- name: report_token_blocks
-- The block indexes the tokens of each sequence need, in the strips' range (the parameter
-- is the largest index drawn), and the sequence's token rows in them.
-- Plan: the tokens are the only large input; they are aggregated once into 64-bit words
-- (block_index >> 6, a bitmap of its low 6 bits): 1/64 of the groups of (seq_id,
-- block_index), expanded again in numpy.
SELECT * FROM (
    SELECT seq_id, block_index >> 6 AS word,
           bit_or(1::UBIGINT << (block_index & 63)) AS bits, count(*) AS tokens
    FROM virtual_token
    WHERE block_index BETWEEN 0 AND ?
    GROUP BY ALL
) SEMI JOIN root_table r USING (seq_id);

-- name: report_sequences
-- Every sequence with its block table(s), in seq_id order.
SELECT r.seq_id, string_agg(DISTINCT r.block_table_ptr::VARCHAR, ', ') AS block_tables
FROM root_table r
GROUP BY r.seq_id
ORDER BY r.seq_id;

-- name: report_capabilities
-- Which capabilities left tables in this database: an imported engine snapshot
-- (engine_request; with KV-cache groups: engine_kv_group), a replayed step log
-- (replay_request, replay_holder_change).
SELECT count(*) FILTER (WHERE table_name = 'engine_request') > 0 AS engine,
       count(*) FILTER (WHERE table_name = 'engine_kv_group') > 0 AS kv_groups,
       count(*) FILTER (WHERE table_name = 'replay_request') > 0 AS replay_requests,
       count(*) FILTER (WHERE table_name IN ('replay_holder_change', 'replay_location')) = 2
           AS replay_log
FROM duckdb_tables();

-- name: report_kv_groups
-- The KV-cache groups of an engine import, the primary one's id and how many there are;
-- run only when engine_kv_group exists.
SELECT coalesce(min(group_id) FILTER (WHERE is_primary), 0) AS primary_group,
       count(*) AS groups
FROM engine_kv_group;

-- name: report_group_blocks
-- The GPU blocks the KV-cache groups other than the primary one hold (the primary group's
-- are block_table_entry's), one row an address in address order: the smallest group
-- holding it, its holders (entries of every group), the engine's ref_cnt (else the
-- holders), its owner (the smallest seq_id). The null block and holes hold nothing. The
-- parameter: the primary group.
-- Plan: one hash aggregate of the groups' entries, joined to the few pools.
WITH held AS (
    SELECT bt.group_id, bt.seq_id, bt.block_index, b.ref_cnt,
           p.base + bt.block_id * p.block_step AS address
    FROM engine_block_table bt
    JOIN engine_pool p ON p.pool_id = bt.pool_id AND p.tier = 'gpu'
    LEFT JOIN engine_block b ON b.pool_id = bt.pool_id AND b.block_id = bt.block_id
    WHERE bt.block_id IS NOT NULL AND NOT coalesce(b.is_null, false) AND bt.group_id <> ?
)
SELECT address, min(group_id) AS group_id,
       count(DISTINCT (group_id, seq_id, block_index)) AS holders,
       coalesce(max(ref_cnt), count(DISTINCT (group_id, seq_id, block_index))) AS refcount,
       min(seq_id) AS seq_id
FROM held GROUP BY address ORDER BY address;

-- name: report_engine_request_ids
-- The engine's request id(s) of each sequence; run only when engine_request exists.
SELECT seq_id, string_agg(DISTINCT request_id, ' ' ORDER BY request_id) AS request_ids
FROM engine_request
GROUP BY seq_id;

-- name: report_replay_request_ids
-- The step log's request id of each sequence (`replay --at` numbers them in order of
-- arrival); run only when replay_request exists.
SELECT seq_id, request_id AS request_ids FROM replay_request;

-- name: report_timeline
-- Blocks in use at the end of each step of the stored step log: GPU blocks with at least
-- one holder, CPU copies of swapped-out entries, and requests alive (each once, whatever
-- its KV-cache groups).
-- Plan: each interval table is turned into +1/-1 changes, summed per step, then one
-- running sum over the steps.
WITH steps AS (
    SELECT DISTINCT step FROM replay_event
), gpu AS (
    SELECT step, sum(CASE WHEN delta = 1 AND holders = 1 THEN 1
                          WHEN delta = -1 AND holders = 0 THEN -1 ELSE 0 END) AS d
    FROM replay_holder_change GROUP BY step
), cpu AS (
    SELECT step, sum(d) AS d FROM (
        SELECT from_step AS step, 1 AS d FROM replay_location WHERE tier = 'cpu'
        UNION ALL
        SELECT to_step, -1 FROM replay_location WHERE tier = 'cpu' AND to_step IS NOT NULL
    ) GROUP BY step
), requests AS (  -- a request has a row per KV-cache group: counted once, by its primary
    SELECT step, sum(d) AS d FROM (
        SELECT arrive_step AS step, 1 AS d FROM replay_request WHERE is_primary
        UNION ALL
        SELECT free_step, -1 FROM replay_request WHERE is_primary AND free_step IS NOT NULL
    ) GROUP BY step
)
SELECT s.step,
       sum(coalesce(g.d, 0)) OVER w AS gpu_blocks,
       sum(coalesce(c.d, 0)) OVER w AS cpu_blocks,
       sum(coalesce(r.d, 0)) OVER w AS requests_alive
FROM steps s
LEFT JOIN gpu g USING (step) LEFT JOIN cpu c USING (step) LEFT JOIN requests r USING (step)
WINDOW w AS (ORDER BY s.step ROWS UNBOUNDED PRECEDING)
ORDER BY s.step;
