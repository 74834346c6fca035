-- Queries behind `explain` and `stats`. Parameters are positional (?).

-- name: explain_decompositions
-- The decompositions of one token: (seq_id, token_pos).
SELECT block_index, offset_in_block FROM virtual_token
WHERE seq_id = ? AND token_pos = ? ORDER BY ALL;

-- name: explain_roots
-- The block tables of one sequence.
SELECT block_table_ptr FROM root_table WHERE seq_id = ? ORDER BY ALL;

-- name: explain_resident
-- GPU entries of one logical block, with the address of one offset in it:
-- (offset_in_block, block_table_id, block_index).
SELECT physical_block_base, refcount, physical_block_base + ?::BIGINT AS physical_address
FROM block_table_entry
WHERE block_table_id = ? AND block_index = ? ORDER BY ALL;

-- name: explain_swapped
-- CPU copies of one logical block, with the address of one offset in it:
-- (offset_in_block, block_table_id, block_index). Same arithmetic as resolve.sql.
SELECT cpu_base_address, pagedkv_wrapping_add(cpu_base_address, ?::BIGINT) AS physical_address
FROM swapped_block
WHERE block_table_id = ? AND block_index = ? ORDER BY ALL;

-- name: stats
-- One row of counts; the parameter is the block size in tokens.
WITH bs AS (SELECT ?::BIGINT AS b),
logical AS (
    SELECT block_table_id, block_index FROM block_table_entry
    UNION
    SELECT block_table_id, block_index FROM swapped_block
),
wanted AS (
    SELECT DISTINCT r.block_table_ptr AS block_table_id, vt.block_index
    FROM virtual_token vt JOIN root_table r USING (seq_id)
),
lengths AS (
    SELECT seq_id, max(token_pos) + 1 AS len FROM virtual_token GROUP BY seq_id
)
SELECT
    (SELECT count(DISTINCT seq_id) FROM root_table) AS sequences,
    (SELECT count(*) FROM (SELECT DISTINCT seq_id, token_pos FROM virtual_token)) AS tokens,
    (SELECT count(*) FROM logical) AS logical_blocks,
    (SELECT count(*) FROM (SELECT DISTINCT block_table_id, block_index FROM block_table_entry))
        AS resident_blocks,
    (SELECT count(*) FROM (SELECT DISTINCT block_table_id, block_index FROM swapped_block))
        AS swapped_blocks,
    (SELECT count(*) FROM wanted w WHERE NOT EXISTS (
        SELECT 1 FROM logical l
        WHERE l.block_table_id = w.block_table_id AND l.block_index = w.block_index))
        AS missing_blocks,
    (SELECT count(DISTINCT physical_block_base) FROM block_table_entry) AS physical_gpu_blocks,
    (SELECT count(DISTINCT cpu_base_address) FROM swapped_block) AS physical_cpu_blocks,
    (SELECT count(*) FROM (SELECT DISTINCT block_table_id, block_index FROM block_table_entry))
      - (SELECT count(DISTINCT physical_block_base) FROM block_table_entry)
        AS blocks_saved_by_sharing,
    (SELECT coalesce(sum((b - len % b) % b), 0) FROM lengths, bs)::BIGINT
        AS unused_token_slots_in_last_blocks,
    (SELECT b FROM bs) AS block_size_tokens,
    256 * (SELECT count(DISTINCT physical_block_base) FROM block_table_entry) AS gpu_bytes,
    256 * (SELECT count(DISTINCT cpu_base_address) FROM swapped_block) AS cpu_bytes;

-- name: refcount_histogram
-- How many distinct physical bases carry each refcount.
SELECT refcount, count(DISTINCT physical_block_base) AS physical_blocks
FROM block_table_entry GROUP BY refcount ORDER BY refcount;
