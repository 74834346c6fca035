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
-- One row of figures; the parameter is the block size in tokens. Every figure is defined
-- in README.md (`stats`); logical = resident + swapped + missing always holds. HUGEINT
-- where a sum or a token position + 1 could pass 2^63.
-- Plan: one DISTINCT per relation, then anti-joins on the small block sets.
WITH bs AS (SELECT ?::BIGINT AS b),
resident AS (SELECT DISTINCT block_table_id, block_index FROM block_table_entry),
copies AS (SELECT DISTINCT block_table_id, block_index FROM swapped_block),
swapped AS (SELECT * FROM copies EXCEPT SELECT * FROM resident),
wanted AS (
    SELECT DISTINCT r.block_table_ptr AS block_table_id, vt.block_index
    FROM virtual_token vt JOIN root_table r USING (seq_id)
),
missing AS (SELECT * FROM wanted EXCEPT (SELECT * FROM resident UNION SELECT * FROM copies)),
lengths AS (
    SELECT seq_id, max(token_pos)::HUGEINT + 1 AS len FROM virtual_token GROUP BY seq_id
),
mappings AS (
    SELECT count(*) AS n FROM (
        SELECT DISTINCT block_table_id, block_index, physical_block_base FROM block_table_entry
    )
)
SELECT
    (SELECT count(DISTINCT seq_id) FROM root_table) AS sequences,
    (SELECT count(*) FROM (SELECT DISTINCT seq_id, token_pos FROM virtual_token)) AS tokens,
    (SELECT count(*) FROM resident) + (SELECT count(*) FROM swapped)
      + (SELECT count(*) FROM missing) AS logical_blocks,
    (SELECT count(*) FROM resident) AS resident_blocks,
    (SELECT count(*) FROM swapped) AS swapped_blocks,
    (SELECT count(*) FROM missing) AS missing_blocks,
    (SELECT count(*) FROM (SELECT * FROM resident INTERSECT SELECT * FROM copies))
        AS resident_blocks_with_cpu_copy,
    (SELECT count(DISTINCT physical_block_base) FROM block_table_entry) AS physical_gpu_blocks,
    (SELECT count(DISTINCT cpu_base_address) FROM swapped_block) AS physical_cpu_blocks,
    (SELECT n FROM mappings)
      - (SELECT count(DISTINCT physical_block_base) FROM block_table_entry)
        AS blocks_saved_by_sharing,
    (SELECT coalesce(sum(((b - len % b) % b + b) % b), 0) FROM lengths, bs WHERE len > 0)
        AS unused_token_slots_in_last_blocks,
    (SELECT b FROM bs) AS block_size_tokens,
    256 * (SELECT count(DISTINCT physical_block_base) FROM block_table_entry)::HUGEINT
        AS gpu_bytes,
    256 * (SELECT count(DISTINCT cpu_base_address) FROM swapped_block)::HUGEINT AS cpu_bytes;

-- name: refcount_histogram
-- How many distinct physical bases carry each refcount.
SELECT refcount, count(DISTINCT physical_block_base) AS physical_blocks
FROM block_table_entry GROUP BY refcount ORDER BY refcount;
