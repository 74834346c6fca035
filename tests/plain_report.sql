-- The queries behind the map and the strips in their plainest form (as first written:
-- the mismatch flag read from the diag_refcount_mismatch view, one aggregate of the
-- tokens by (seq_id, block_index)): the oracle for tests/test_report_data.py.

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
