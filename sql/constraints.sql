-- Validation queries. Every `spec_*` and `diag_*` statement is a view that returns the
-- offending rows with a `reason`; `check` runs them all. The comment under each name is
-- the one-line explanation the CLI and the docs show.
--   spec_*  the spec's integrity constraints: errors; data that violates one is refused.
--   diag_*  consistency checks beyond the spec: warnings (errors under --strict).
-- The spec checks are macros over a relation name too, so a load can run the very same
-- query on its staged rows before anything is written.
-- Every check returns a set: exact duplicate rows (which a load collapses, but an INSERT
-- from the DuckDB shell need not) are one fact, as in the spec. Each `Plan:` comment says
-- how a check avoids hashing or sorting all of virtual_token (docs/performance.md).
-- The same views run on Spark (pagedkv_sql/spark, translated by sqlglot), so they keep to
-- what both engines run alike: a sorted list is list_sort(list(x)), not list(x ORDER BY x);
-- a sorted string_agg is array_to_string(list_sort(list(x)), sep) (Spark fails on a
-- DISTINCT listagg beside other DISTINCT aggregates); a filtered list that may be empty is
-- NULL by an explicit CASE (Spark's would be []). See docs/scale.md.

-- name: macro_spec_unaligned_base
CREATE OR REPLACE MACRO pagedkv_spec_unaligned_base(rel) AS TABLE
SELECT DISTINCT block_table_id, block_index, physical_block_base, refcount,
       'physical_block_base ' || physical_block_base || ' is not 256-byte aligned ('
           || physical_block_base || ' mod 256 = ' || (physical_block_base % 256) || ')' AS reason
FROM query_table(rel)
WHERE physical_block_base % 256 <> 0;

-- name: macro_spec_offset_out_of_block
CREATE OR REPLACE MACRO pagedkv_spec_offset_out_of_block(rel) AS TABLE
SELECT DISTINCT seq_id, token_pos, block_index, offset_in_block,
       'offset_in_block ' || offset_in_block || ' is outside [0, 255]' AS reason
FROM query_table(rel)
WHERE offset_in_block < 0 OR offset_in_block >= 256;

-- name: macro_spec_negative_refcount
CREATE OR REPLACE MACRO pagedkv_spec_negative_refcount(rel) AS TABLE
SELECT DISTINCT block_table_id, block_index, physical_block_base, refcount,
       'refcount ' || refcount || ' is negative' AS reason
FROM query_table(rel)
WHERE refcount < 0;

-- name: spec_unaligned_base
-- A block_table_entry whose physical_block_base is not a multiple of 256.
CREATE OR REPLACE VIEW spec_unaligned_base AS
SELECT * FROM pagedkv_spec_unaligned_base('block_table_entry');

-- name: spec_offset_out_of_block
-- A virtual_token whose offset_in_block is outside [0, 255].
CREATE OR REPLACE VIEW spec_offset_out_of_block AS
SELECT * FROM pagedkv_spec_offset_out_of_block('virtual_token');

-- name: spec_negative_refcount
-- A block_table_entry with a negative refcount.
CREATE OR REPLACE VIEW spec_negative_refcount AS
SELECT * FROM pagedkv_spec_negative_refcount('block_table_entry');

-- name: macro_block_keys_ascending
-- Plan: one streaming pass (no sort, no hash): the (block_table_id, block_index) keys of
-- relation rel in scan order, one chain (a single row without a predecessor), each key
-- strictly greater than the one before. True proves every key unique, whatever order the
-- scan gave; false proves nothing. DuckDB only: no view uses it (Spark's lag needs an
-- ORDER BY), the check runner passes its answer to the macros below.
CREATE OR REPLACE MACRO pagedkv_block_keys_ascending(rel) AS TABLE
SELECT count(*) FILTER (WHERE prev_id IS NULL) <= 1
       AND count(*) FILTER (WHERE prev_id IS NOT NULL
                            AND NOT (block_table_id > prev_id
                                     OR (block_table_id = prev_id AND block_index > prev_index)))
           = 0 AS ascending
FROM (SELECT block_table_id, block_index, lag(block_table_id) OVER () AS prev_id,
             lag(block_index) OVER () AS prev_index
      FROM query_table(rel));

-- name: macro_diag_refcount_mismatch
-- Plan: one aggregate by base finds the suspects. When the runner has proven the keys of
-- block_table_entry unique (keys_unique), a base's rows are its holders, so the count of
-- rows is the count of holders: that one aggregate decides. Otherwise bases with a single
-- row are decided by it (refcount must be 1) and only shared bases are grouped by holder
-- (one row per holder first, so exact duplicate rows cannot inflate the count). Only the
-- suspects' rows are described.
CREATE OR REPLACE MACRO pagedkv_diag_refcount_mismatch(keys_unique) AS TABLE
WITH per_base AS (
    SELECT physical_block_base, count(*) AS n, min(refcount) AS low, max(refcount) AS high
    FROM block_table_entry
    GROUP BY ALL
), holders AS (
    SELECT physical_block_base, block_table_id, block_index,
           min(refcount) AS low, max(refcount) AS high
    FROM block_table_entry
    SEMI JOIN (SELECT physical_block_base FROM per_base WHERE n > 1 AND NOT keys_unique)
        USING (physical_block_base)
    GROUP BY ALL
), suspects AS (
    SELECT physical_block_base FROM per_base
    WHERE CASE WHEN keys_unique THEN n <> low OR low <> high ELSE n = 1 AND low <> 1 END
    UNION ALL
    SELECT physical_block_base
    FROM holders
    GROUP BY ALL
    HAVING min(low) <> max(high) OR min(low) <> count(*)
)
SELECT physical_block_base,
       count(DISTINCT (block_table_id, block_index)) AS holders,
       list_sort(list(DISTINCT refcount)) AS refcounts,
       array_to_string(list_sort(list(DISTINCT block_table_id || ':' || block_index)), ' ')
           AS held_by,
       CASE WHEN count(DISTINCT refcount) > 1
            THEN 'holders disagree on the refcount'
            ELSE 'refcount ' || min(refcount) || ' but '
                 || count(DISTINCT (block_table_id, block_index)) || ' holder(s)' END AS reason
FROM block_table_entry SEMI JOIN suspects USING (physical_block_base)
GROUP BY physical_block_base;

-- name: diag_refcount_mismatch
-- A physical base whose refcount differs from the number of block table slots holding it,
-- or whose holders disagree on the refcount (a leak, or a double free waiting to happen).
CREATE OR REPLACE VIEW diag_refcount_mismatch AS
SELECT * FROM pagedkv_diag_refcount_mismatch(false);

-- name: macro_diag_conflicting_location
-- Plan: min <> max per key in each tier, and a semi-join across tiers, find the suspect
-- keys without hashing every (key, address) pair; a tier whose keys the runner has proven
-- unique (gpu_keys_unique, cpu_keys_unique) cannot hold a key twice and is not grouped at
-- all. Only the suspects' rows are described.
CREATE OR REPLACE MACRO pagedkv_diag_conflicting_location(gpu_keys_unique, cpu_keys_unique)
AS TABLE
WITH suspects AS (
    SELECT block_table_id, block_index FROM block_table_entry WHERE NOT gpu_keys_unique
    GROUP BY ALL
    HAVING min(physical_block_base) <> max(physical_block_base)
    UNION
    SELECT block_table_id, block_index FROM swapped_block WHERE NOT cpu_keys_unique
    GROUP BY ALL
    HAVING min(cpu_base_address) <> max(cpu_base_address)
    UNION
    SELECT block_table_id, block_index
    FROM swapped_block SEMI JOIN block_table_entry USING (block_table_id, block_index)
), loc AS (
    SELECT block_table_id, block_index, 'gpu' AS tier, physical_block_base AS address
    FROM block_table_entry SEMI JOIN suspects USING (block_table_id, block_index)
    UNION
    SELECT block_table_id, block_index, 'cpu', cpu_base_address
    FROM swapped_block SEMI JOIN suspects USING (block_table_id, block_index)
)
SELECT block_table_id, block_index,
       CASE WHEN count(*) FILTER (WHERE tier = 'gpu') > 0
            THEN list_sort(list(address) FILTER (WHERE tier = 'gpu')) END AS gpu_bases,
       CASE WHEN count(*) FILTER (WHERE tier = 'cpu') > 0
            THEN list_sort(list(address) FILTER (WHERE tier = 'cpu')) END AS cpu_addresses,
       CASE WHEN count(DISTINCT tier) > 1 THEN 'resident and swapped at once'
            WHEN min(tier) = 'gpu' THEN count(*) || ' different GPU bases'
            ELSE count(*) || ' different CPU addresses' END AS reason
FROM loc
GROUP BY block_table_id, block_index
HAVING count(*) > 1;

-- name: diag_conflicting_location
-- A logical block (block_table_id, block_index) in more than one place: two GPU bases,
-- two CPU addresses, or resident and swapped at once.
CREATE OR REPLACE VIEW diag_conflicting_location AS
SELECT * FROM pagedkv_diag_conflicting_location(false, false);

-- name: diag_conflicting_root
-- A sequence with more than one block table.
CREATE OR REPLACE VIEW diag_conflicting_root AS
SELECT seq_id, list_sort(list(DISTINCT block_table_ptr)) AS block_table_ptrs,
       count(DISTINCT block_table_ptr) || ' block tables for one sequence' AS reason
FROM root_table
GROUP BY seq_id
HAVING min(block_table_ptr) <> max(block_table_ptr);

-- name: macro_diag_token_decomposition
-- Plan: one scan finds the rows whose own decomposition is wrong. A token whose rows are
-- all right has exactly one decomposition (0 <= offset < block size and
-- block_index * block size + offset = token_pos fix both), so only the tokens with a wrong
-- row are gathered (a semi-join) and counted; no window over every token. The product is
-- computed in 64 bits where it cannot overflow (|block_index| < 2^31, block size < 2^31,
-- 0 <= offset < block size), in 128 only for the other rows.
CREATE OR REPLACE MACRO pagedkv_diag_token_decomposition(block_size) AS TABLE
WITH wrong AS (
    SELECT seq_id, token_pos
    FROM virtual_token
    WHERE CASE WHEN offset_in_block < 0 OR offset_in_block >= block_size THEN true
               WHEN block_index BETWEEN -2147483648 AND 2147483647
                    AND block_size <= 2147483647
                   THEN block_index * block_size + offset_in_block <> token_pos
               ELSE block_index::HUGEINT * block_size + offset_in_block <> token_pos END
), suspects AS (
    SELECT DISTINCT * FROM virtual_token SEMI JOIN wrong USING (seq_id, token_pos)
), counted AS (
    SELECT *, count(*) OVER (PARTITION BY seq_id, token_pos) AS decompositions
    FROM suspects
)
SELECT seq_id, token_pos, block_index, offset_in_block,
       CASE WHEN decompositions > 1
                THEN decompositions || ' decompositions of one token'
            WHEN offset_in_block >= block_size
                THEN 'offset_in_block ' || offset_in_block || ' >= block size ' || block_size
            WHEN offset_in_block < 0
                THEN 'offset_in_block ' || offset_in_block || ' is negative'
            ELSE 'block_index * ' || block_size || ' + offset_in_block = '
                 || (block_index::HUGEINT * block_size + offset_in_block)
                 || ', not token_pos ' || token_pos END AS reason
FROM counted;

-- name: diag_token_decomposition
-- A token with more than one decomposition, or whose (block_index, offset_in_block) does
-- not give back token_pos for the block size in tokens (setting block_size, default 16).
CREATE OR REPLACE VIEW diag_token_decomposition AS
SELECT * FROM pagedkv_diag_token_decomposition(
    (SELECT value FROM pagedkv_settings WHERE name = 'block_size'));

-- name: macro_diag_unresolved_token
-- Plan: one anti-join of the tokens against every (seq_id, block_index) that has a
-- location in either tier, streamed into the reason: the block tables of each sequence
-- come from one aggregate over root_table (its size, not the findings'), and no CTE is
-- read twice, so no finding is materialized. When the runner has proven the tokens unique
-- (tokens_unique, from a streaming pass over their keys), rows are not made distinct
-- either; otherwise exact duplicate rows are dropped by a (spillable) hash aggregate.
CREATE OR REPLACE MACRO pagedkv_diag_unresolved_token(tokens_unique) AS TABLE
WITH located AS (
    SELECT r.seq_id, b.block_index
    FROM root_table r JOIN block_table_entry b ON b.block_table_id = r.block_table_ptr
    UNION ALL
    SELECT r.seq_id, s.block_index
    FROM root_table r JOIN swapped_block s ON s.block_table_id = r.block_table_ptr
), tables AS (
    SELECT seq_id,
           array_to_string(list_sort(list(DISTINCT block_table_ptr::VARCHAR)), ', ')
               AS block_tables
    FROM root_table
    GROUP BY seq_id
), unresolved AS (
    SELECT DISTINCT * FROM virtual_token ANTI JOIN located USING (seq_id, block_index)
    WHERE NOT tokens_unique
    UNION ALL
    SELECT * FROM virtual_token ANTI JOIN located USING (seq_id, block_index)
    WHERE tokens_unique
)
SELECT u.seq_id, u.token_pos, u.block_index, u.offset_in_block,
       CASE WHEN t.block_tables IS NULL
            THEN 'no root_table row for seq_id ' || u.seq_id
            ELSE 'block ' || u.block_index || ' of block table ' || t.block_tables
                 || ' is neither resident nor swapped' END AS reason
FROM unresolved u LEFT JOIN tables t USING (seq_id);

-- name: pagedkv_token_keys
-- virtual_token's (seq_id, token_pos) keys under the names pagedkv_block_keys_ascending
-- reads, in scan order: that macro over this view proves every token row unique.
CREATE OR REPLACE VIEW pagedkv_token_keys AS
SELECT seq_id AS block_table_id, token_pos AS block_index FROM virtual_token;

-- name: diag_unresolved_token
-- A token that resolves to no address (a page fault), and why.
CREATE OR REPLACE VIEW diag_unresolved_token AS
SELECT * FROM pagedkv_diag_unresolved_token(false);

-- name: diag_overlapping_blocks
-- Two different block addresses of one tier less than 256 bytes apart.
-- Plan: two different 256-aligned addresses are at least 256 bytes apart, so a tier can
-- only overlap when it holds an unaligned address; a cheap EXISTS skips the sort otherwise
-- (always, for the GPU tier, whose bases the schema keeps aligned).
CREATE OR REPLACE VIEW diag_overlapping_blocks AS
WITH addresses AS (
    SELECT DISTINCT 'gpu' AS tier, physical_block_base AS address FROM block_table_entry
    WHERE EXISTS (SELECT 1 FROM block_table_entry WHERE physical_block_base % 256 <> 0)
    UNION
    SELECT DISTINCT 'cpu', cpu_base_address FROM swapped_block
    WHERE EXISTS (SELECT 1 FROM swapped_block WHERE cpu_base_address % 256 <> 0)
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
-- A swapped block whose cpu_base_address is not 256-byte aligned.
CREATE OR REPLACE VIEW diag_unaligned_cpu_address AS
SELECT DISTINCT block_table_id, block_index, cpu_base_address,
       'cpu_base_address ' || cpu_base_address || ' is not 256-byte aligned' AS reason
FROM swapped_block
WHERE cpu_base_address % 256 <> 0;

-- name: diag_orphan_block_table
-- A block table that no sequence points to (its blocks are leaked).
-- Plan: the orphans' rows are filtered out first (an anti-join against the small
-- root_table), so only they are grouped.
CREATE OR REPLACE VIEW diag_orphan_block_table AS
WITH orphan_blocks AS (
    SELECT block_table_id, block_index, 'gpu' AS tier FROM block_table_entry
    WHERE block_table_id NOT IN (SELECT block_table_ptr FROM root_table)
    UNION ALL
    SELECT block_table_id, block_index, 'cpu' FROM swapped_block
    WHERE block_table_id NOT IN (SELECT block_table_ptr FROM root_table)
)
SELECT block_table_id,
       count(DISTINCT block_index) FILTER (WHERE tier = 'gpu')::BIGINT AS resident_blocks,
       count(DISTINCT block_index) FILTER (WHERE tier = 'cpu')::BIGINT AS swapped_blocks,
       'no root_table row points to block table ' || block_table_id AS reason
FROM orphan_blocks
GROUP BY block_table_id;

-- name: diag_orphan_swapped_block
-- A swapped block of a block table that no sequence points to (CPU memory leaked).
CREATE OR REPLACE VIEW diag_orphan_swapped_block AS
SELECT DISTINCT block_table_id, block_index, cpu_base_address,
       'swapped block of orphan block table ' || block_table_id AS reason
FROM swapped_block
WHERE block_table_id NOT IN (SELECT block_table_ptr FROM root_table);
