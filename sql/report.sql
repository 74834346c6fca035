-- Queries behind `map` and `report` (pagedkv_sql/report/). Read-only: they create
-- nothing, so a database opened read-only can be drawn. The core never runs them.
-- A sequence's owner of a block table is the smallest seq_id whose root_table row points
-- to it (diag_conflicting_root names the others); a block whose holders have no
-- root_table row at all is leaked (diag_orphan_block_table).

-- name: report_gpu_blocks
-- One row per distinct GPU block base, in address order: how many block-table slots hold
-- it, its largest refcount, its owner (-1: none) and whether check calls it a mismatch.
-- Plan: one hash aggregate of block_table_entry joined to the small root_table counts
-- rows; only the bases with more than one row are counted again by distinct slot (exact
-- duplicate rows are one fact), as diag_refcount_mismatch does. The mismatch view only
-- describes its few suspects (constraints.sql).
WITH owners AS (
    SELECT block_table_ptr, min(seq_id) AS seq_id FROM root_table GROUP BY ALL
), per_base AS (
    SELECT b.physical_block_base AS address,
           count(*) AS n,
           max(b.refcount) AS refcount,
           coalesce(min(o.seq_id), -1) AS seq_id,
           bool_and(o.seq_id IS NULL) AS orphan
    FROM block_table_entry b LEFT JOIN owners o ON o.block_table_ptr = b.block_table_id
    GROUP BY ALL
), multi AS (
    SELECT physical_block_base AS address,
           count(DISTINCT (block_table_id, block_index)) AS holders
    FROM block_table_entry
    SEMI JOIN (SELECT address FROM per_base WHERE n > 1) p ON p.address = physical_block_base
    GROUP BY ALL
)
SELECT p.address, coalesce(x.holders, p.n) AS holders, p.refcount, p.seq_id, p.orphan,
       m.physical_block_base IS NOT NULL AS mismatch
FROM per_base p
LEFT JOIN multi x USING (address)
LEFT JOIN (SELECT DISTINCT physical_block_base FROM diag_refcount_mismatch) m
       ON m.physical_block_base = p.address
ORDER BY p.address;

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

-- name: report_logical_blocks
-- Every logical block of every sequence with its state: 1 resident, 2 resident and
-- shared, 3 swapped, 4 resident in a refcount-mismatch base, 5 missing (a token needs it,
-- no tier has it), and the tokens in it. The parameter is the largest block index drawn.
-- Plan: the tokens are aggregated once by (seq_id, block_index) (they are the only large
-- input); everything else is per block table slot.
WITH roots AS (
    SELECT seq_id, block_table_ptr AS block_table_id FROM root_table
), tokens AS (
    SELECT seq_id, block_index, count(*) AS tokens FROM virtual_token GROUP BY ALL
), resident AS (
    SELECT b.block_table_id, b.block_index,
           max(CASE WHEN m.physical_block_base IS NOT NULL THEN 4
                    WHEN g.holders > 1 THEN 2 ELSE 1 END) AS state
    FROM block_table_entry b
    JOIN (SELECT physical_block_base, count(DISTINCT (block_table_id, block_index)) AS holders
          FROM block_table_entry GROUP BY ALL) g USING (physical_block_base)
    LEFT JOIN (SELECT DISTINCT physical_block_base FROM diag_refcount_mismatch) m
           USING (physical_block_base)
    GROUP BY ALL
), located AS (
    SELECT r.seq_id, x.block_index, x.state
    FROM resident x JOIN roots r USING (block_table_id)
    UNION ALL
    SELECT r.seq_id, s.block_index, 3
    FROM swapped_block s JOIN roots r USING (block_table_id)
), states AS (
    SELECT seq_id, block_index, max(state) AS state FROM located GROUP BY ALL
)
SELECT coalesce(s.seq_id, t.seq_id) AS seq_id,
       coalesce(s.block_index, t.block_index) AS block_index,
       coalesce(s.state, 5) AS state,
       coalesce(t.tokens, 0) AS tokens
FROM states s FULL JOIN tokens t USING (seq_id, block_index)
WHERE coalesce(s.block_index, t.block_index) BETWEEN 0 AND ?
  AND coalesce(s.seq_id, t.seq_id) IN (SELECT seq_id FROM roots);

-- name: report_sequences
-- Every sequence with its block table(s), in seq_id order.
SELECT r.seq_id, string_agg(DISTINCT r.block_table_ptr::VARCHAR, ', ') AS block_tables
FROM root_table r
GROUP BY r.seq_id
ORDER BY r.seq_id;

-- name: report_capabilities
-- Which capabilities left tables in this database: an imported engine snapshot
-- (engine_request), a replayed step log (replay_request, replay_holder_change).
SELECT count(*) FILTER (WHERE table_name = 'engine_request') > 0 AS engine,
       count(*) FILTER (WHERE table_name = 'replay_request') > 0 AS replay_requests,
       count(*) FILTER (WHERE table_name IN ('replay_holder_change', 'replay_location')) = 2
           AS replay_log
FROM duckdb_tables();

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
-- one holder, CPU copies of swapped-out entries, and requests alive.
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
), requests AS (
    SELECT step, sum(d) AS d FROM (
        SELECT arrive_step AS step, 1 AS d FROM replay_request
        UNION ALL
        SELECT free_step, -1 FROM replay_request WHERE free_step IS NOT NULL
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
