-- The diagnostics in their plainest form: the oracle for tests/test_sql_constraints_plans.py.
-- Each is the direct reading of its description (a window over every token, a hash of
-- every (key, address) pair, a correlated NOT EXISTS), with none of the plans that make
-- sql/constraints.sql fast. They read plain_<relation>: the relation as a set.

-- name: diag_refcount_mismatch
SELECT physical_block_base,
       count(DISTINCT (block_table_id, block_index)) AS holders,
       list(DISTINCT refcount ORDER BY refcount) AS refcounts,
       string_agg(DISTINCT block_table_id || ':' || block_index, ' '
                  ORDER BY block_table_id || ':' || block_index) AS held_by,
       CASE WHEN count(DISTINCT refcount) > 1
            THEN 'holders disagree on the refcount'
            ELSE 'refcount ' || min(refcount) || ' but '
                 || count(DISTINCT (block_table_id, block_index)) || ' holder(s)' END AS reason
FROM plain_block_table_entry
GROUP BY physical_block_base
HAVING count(DISTINCT refcount) > 1
    OR min(refcount) <> count(DISTINCT (block_table_id, block_index));

-- name: diag_conflicting_location
WITH loc AS (
    SELECT block_table_id, block_index, 'gpu' AS tier, physical_block_base AS address
    FROM plain_block_table_entry
    UNION
    SELECT block_table_id, block_index, 'cpu', cpu_base_address FROM plain_swapped_block
)
SELECT block_table_id, block_index,
       list(address ORDER BY address) FILTER (WHERE tier = 'gpu') AS gpu_bases,
       list(address ORDER BY address) FILTER (WHERE tier = 'cpu') AS cpu_addresses,
       CASE WHEN count(DISTINCT tier) > 1 THEN 'resident and swapped at once'
            WHEN min(tier) = 'gpu' THEN count(*) || ' different GPU bases'
            ELSE count(*) || ' different CPU addresses' END AS reason
FROM loc
GROUP BY block_table_id, block_index
HAVING count(*) > 1;

-- name: diag_conflicting_root
SELECT seq_id, list(block_table_ptr ORDER BY block_table_ptr) AS block_table_ptrs,
       count(*) || ' block tables for one sequence' AS reason
FROM plain_root_table
GROUP BY seq_id
HAVING count(*) > 1;

-- name: diag_token_decomposition
WITH counted AS (
    SELECT *, count(*) OVER (PARTITION BY seq_id, token_pos) AS decompositions
    FROM plain_virtual_token
)
SELECT seq_id, token_pos, block_index, offset_in_block,
       CASE WHEN decompositions > 1
                THEN decompositions || ' decompositions of one token'
            WHEN offset_in_block >= $block_size
                THEN 'offset_in_block ' || offset_in_block || ' >= block size ' || $block_size
            ELSE 'block_index * ' || $block_size || ' + offset_in_block = '
                 || (block_index::HUGEINT * $block_size + offset_in_block)
                 || ', not token_pos ' || token_pos END AS reason
FROM counted
WHERE decompositions > 1
   OR offset_in_block >= $block_size
   OR block_index::HUGEINT * $block_size + offset_in_block <> token_pos;

-- name: diag_unresolved_token
SELECT vt.seq_id, vt.token_pos, vt.block_index, vt.offset_in_block,
       CASE WHEN NOT EXISTS (SELECT 1 FROM plain_root_table r WHERE r.seq_id = vt.seq_id)
            THEN 'no root_table row for seq_id ' || vt.seq_id
            ELSE 'block ' || vt.block_index || ' of block table '
                 || (SELECT string_agg(DISTINCT r.block_table_ptr::VARCHAR, ', '
                                       ORDER BY r.block_table_ptr::VARCHAR)
                     FROM plain_root_table r WHERE r.seq_id = vt.seq_id)
                 || ' is neither resident nor swapped' END AS reason
FROM plain_virtual_token vt
WHERE NOT EXISTS (
        SELECT 1 FROM plain_root_table r
        JOIN plain_block_table_entry b ON b.block_table_id = r.block_table_ptr
        WHERE r.seq_id = vt.seq_id AND b.block_index = vt.block_index)
  AND NOT EXISTS (
        SELECT 1 FROM plain_root_table r
        JOIN plain_swapped_block s ON s.block_table_id = r.block_table_ptr
        WHERE r.seq_id = vt.seq_id AND s.block_index = vt.block_index);

-- name: diag_overlapping_blocks
WITH addresses AS (
    SELECT DISTINCT 'gpu' AS tier, physical_block_base AS address FROM plain_block_table_entry
    UNION
    SELECT DISTINCT 'cpu', cpu_base_address FROM plain_swapped_block
), neighbours AS (
    SELECT tier, lag(address) OVER (PARTITION BY tier ORDER BY address) AS lower_address,
           address AS upper_address
    FROM addresses
)
SELECT tier, lower_address, upper_address,
       'blocks at ' || lower_address || ' and ' || upper_address || ' overlap ('
           || (upper_address::HUGEINT - lower_address) || ' bytes apart, block size 256)' AS reason
FROM neighbours
WHERE lower_address IS NOT NULL AND upper_address::HUGEINT - lower_address < 256;

-- name: diag_unaligned_cpu_address
SELECT block_table_id, block_index, cpu_base_address,
       'cpu_base_address ' || cpu_base_address || ' is not 256-byte aligned' AS reason
FROM plain_swapped_block
WHERE cpu_base_address % 256 <> 0;

-- name: diag_orphan_block_table
WITH tables AS (
    SELECT block_table_id, count(*) AS resident_blocks, 0 AS swapped_blocks
    FROM (SELECT DISTINCT block_table_id, block_index FROM plain_block_table_entry)
    GROUP BY ALL
    UNION ALL
    SELECT block_table_id, 0, count(*)
    FROM (SELECT DISTINCT block_table_id, block_index FROM plain_swapped_block)
    GROUP BY ALL
)
SELECT block_table_id, sum(resident_blocks)::BIGINT AS resident_blocks,
       sum(swapped_blocks)::BIGINT AS swapped_blocks,
       'no root_table row points to block table ' || block_table_id AS reason
FROM tables
WHERE block_table_id NOT IN (SELECT block_table_ptr FROM plain_root_table)
GROUP BY block_table_id;

-- name: diag_orphan_swapped_block
SELECT block_table_id, block_index, cpu_base_address,
       'swapped block of orphan block table ' || block_table_id AS reason
FROM plain_swapped_block
WHERE block_table_id NOT IN (SELECT block_table_ptr FROM plain_root_table);
