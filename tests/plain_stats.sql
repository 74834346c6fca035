-- `stats` in its plainest form: the oracle for tests/test_sql_inspect.py. Each figure is the
-- direct reading of its definition in README.md: a DISTINCT over every key, EXCEPT and
-- INTERSECT of the block sets, with none of the word bitmaps that make sql/inspect.sql fast.
-- $block_size is the block size in tokens.

-- name: stats
WITH bs AS (SELECT $block_size::BIGINT AS b),
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
SELECT refcount, count(DISTINCT physical_block_base) AS physical_blocks
FROM block_table_entry GROUP BY refcount ORDER BY refcount;
