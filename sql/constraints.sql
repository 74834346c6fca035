-- Validation queries. Every `spec_*` and `diag_*` statement is a view that returns the
-- offending rows with a `reason`; `check` runs them all. The comment under each name is
-- the one-line explanation the CLI and the docs show.
--   spec_*  the spec's integrity constraints: errors; data that violates one is refused.
--   diag_*  consistency checks beyond the spec: warnings (errors under --strict).
-- The spec checks are macros over a relation name too, so a load can run the very same
-- query on its staged rows before anything is written.

-- name: macro_spec_unaligned_base
CREATE OR REPLACE MACRO pagedkv_spec_unaligned_base(rel) AS TABLE
SELECT block_table_id, block_index, physical_block_base, refcount,
       'physical_block_base ' || physical_block_base || ' is not 256-byte aligned ('
           || physical_block_base || ' mod 256 = ' || (physical_block_base % 256) || ')' AS reason
FROM query_table(rel)
WHERE physical_block_base % 256 <> 0;

-- name: macro_spec_offset_out_of_block
CREATE OR REPLACE MACRO pagedkv_spec_offset_out_of_block(rel) AS TABLE
SELECT seq_id, token_pos, block_index, offset_in_block,
       'offset_in_block ' || offset_in_block || ' is outside [0, 255]' AS reason
FROM query_table(rel)
WHERE offset_in_block < 0 OR offset_in_block >= 256;

-- name: macro_spec_negative_refcount
CREATE OR REPLACE MACRO pagedkv_spec_negative_refcount(rel) AS TABLE
SELECT block_table_id, block_index, physical_block_base, refcount,
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

-- name: diag_refcount_mismatch
-- A physical base whose refcount differs from the number of block table slots holding it,
-- or whose holders disagree on the refcount (a leak, or a double free waiting to happen).
CREATE OR REPLACE VIEW diag_refcount_mismatch AS
SELECT physical_block_base,
       count(DISTINCT (block_table_id, block_index)) AS holders,
       list(DISTINCT refcount ORDER BY refcount) AS refcounts,
       string_agg(DISTINCT block_table_id || ':' || block_index, ' '
                  ORDER BY block_table_id || ':' || block_index) AS held_by,
       CASE WHEN count(DISTINCT refcount) > 1
            THEN 'holders disagree on the refcount'
            ELSE 'refcount ' || min(refcount) || ' but '
                 || count(DISTINCT (block_table_id, block_index)) || ' holder(s)' END AS reason
FROM block_table_entry
GROUP BY physical_block_base
HAVING count(DISTINCT refcount) > 1
    OR min(refcount) <> count(DISTINCT (block_table_id, block_index));

-- name: diag_conflicting_location
-- A logical block (block_table_id, block_index) in more than one place: two GPU bases,
-- two CPU addresses, or resident and swapped at once.
CREATE OR REPLACE VIEW diag_conflicting_location AS
WITH loc AS (
    SELECT block_table_id, block_index, 'gpu' AS tier, physical_block_base AS address
    FROM block_table_entry
    UNION
    SELECT block_table_id, block_index, 'cpu', cpu_base_address FROM swapped_block
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
-- A sequence with more than one block table.
CREATE OR REPLACE VIEW diag_conflicting_root AS
SELECT seq_id, list(block_table_ptr ORDER BY block_table_ptr) AS block_table_ptrs,
       count(*) || ' block tables for one sequence' AS reason
FROM root_table
GROUP BY seq_id
HAVING count(*) > 1;

-- name: macro_diag_token_decomposition
CREATE OR REPLACE MACRO pagedkv_diag_token_decomposition(block_size) AS TABLE
WITH counted AS (
    SELECT *, count(*) OVER (PARTITION BY seq_id, token_pos) AS decompositions
    FROM virtual_token
)
SELECT seq_id, token_pos, block_index, offset_in_block,
       CASE WHEN decompositions > 1
                THEN decompositions || ' decompositions of one token'
            WHEN offset_in_block >= block_size
                THEN 'offset_in_block ' || offset_in_block || ' >= block size ' || block_size
            ELSE 'block_index * ' || block_size || ' + offset_in_block = '
                 || (block_index::HUGEINT * block_size + offset_in_block)
                 || ', not token_pos ' || token_pos END AS reason
FROM counted
WHERE decompositions > 1
   OR offset_in_block >= block_size
   OR block_index::HUGEINT * block_size + offset_in_block <> token_pos;

-- name: diag_token_decomposition
-- A token with more than one decomposition, or whose (block_index, offset_in_block) does
-- not give back token_pos for the block size in tokens (setting block_size, default 16).
CREATE OR REPLACE VIEW diag_token_decomposition AS
SELECT * FROM pagedkv_diag_token_decomposition(
    (SELECT value FROM pagedkv_settings WHERE name = 'block_size'));

-- name: diag_unresolved_token
-- A token that resolves to no address (a page fault), and why.
CREATE OR REPLACE VIEW diag_unresolved_token AS
SELECT vt.seq_id, vt.token_pos, vt.block_index, vt.offset_in_block,
       CASE WHEN NOT EXISTS (SELECT 1 FROM root_table r WHERE r.seq_id = vt.seq_id)
            THEN 'no root_table row for seq_id ' || vt.seq_id
            ELSE 'block ' || vt.block_index || ' of block table '
                 || (SELECT string_agg(DISTINCT r.block_table_ptr::VARCHAR, ', ')
                     FROM root_table r WHERE r.seq_id = vt.seq_id)
                 || ' is neither resident nor swapped' END AS reason
FROM virtual_token vt
WHERE NOT EXISTS (
        SELECT 1 FROM root_table r JOIN block_table_entry b ON b.block_table_id = r.block_table_ptr
        WHERE r.seq_id = vt.seq_id AND b.block_index = vt.block_index)
  AND NOT EXISTS (
        SELECT 1 FROM root_table r JOIN swapped_block s ON s.block_table_id = r.block_table_ptr
        WHERE r.seq_id = vt.seq_id AND s.block_index = vt.block_index);

-- name: diag_overlapping_blocks
-- Two different block addresses of one tier less than 256 bytes apart.
CREATE OR REPLACE VIEW diag_overlapping_blocks AS
WITH addresses AS (
    SELECT DISTINCT 'gpu' AS tier, physical_block_base AS address FROM block_table_entry
    UNION
    SELECT DISTINCT 'cpu', cpu_base_address FROM swapped_block
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
SELECT block_table_id, block_index, cpu_base_address,
       'cpu_base_address ' || cpu_base_address || ' is not 256-byte aligned' AS reason
FROM swapped_block
WHERE cpu_base_address % 256 <> 0;

-- name: diag_orphan_block_table
-- A block table that no sequence points to (its blocks are leaked).
CREATE OR REPLACE VIEW diag_orphan_block_table AS
WITH tables AS (
    SELECT block_table_id, count(*) AS resident_blocks, 0 AS swapped_blocks
    FROM block_table_entry GROUP BY ALL
    UNION ALL
    SELECT block_table_id, 0, count(*) FROM swapped_block GROUP BY ALL
)
SELECT block_table_id, sum(resident_blocks)::BIGINT AS resident_blocks,
       sum(swapped_blocks)::BIGINT AS swapped_blocks,
       'no root_table row points to block table ' || block_table_id AS reason
FROM tables
WHERE block_table_id NOT IN (SELECT block_table_ptr FROM root_table)
GROUP BY block_table_id;

-- name: diag_orphan_swapped_block
-- A swapped block of a block table that no sequence points to (CPU memory leaked).
CREATE OR REPLACE VIEW diag_orphan_swapped_block AS
SELECT block_table_id, block_index, cpu_base_address,
       'swapped block of orphan block table ' || block_table_id AS reason
FROM swapped_block
WHERE block_table_id NOT IN (SELECT block_table_ptr FROM root_table);
