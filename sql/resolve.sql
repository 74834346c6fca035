-- Address resolution: one macro and one view per rule of the spec, and
-- resolved_kv_address as their UNION (a set, as Soufflé's relations are).
-- The macros take the name of the token relation, so that a stream of tokens can be
-- resolved against the stored block tables without storing it.

-- name: resolve_gpu_macro
-- Case 1: block resident in GPU memory.
CREATE OR REPLACE MACRO pagedkv_resolve_gpu(tokens) AS TABLE
SELECT vt.seq_id, vt.token_pos, b.physical_block_base + vt.offset_in_block AS physical_address
FROM query_table(tokens) AS vt
JOIN root_table AS r ON r.seq_id = vt.seq_id
JOIN block_table_entry AS b
  ON b.block_table_id = r.block_table_ptr AND b.block_index = vt.block_index;

-- name: resolve_cpu_macro
-- Case 2: block swapped to CPU (fallback path).
CREATE OR REPLACE MACRO pagedkv_resolve_cpu(tokens) AS TABLE
SELECT vt.seq_id, vt.token_pos,
       pagedkv_wrapping_add(s.cpu_base_address, vt.offset_in_block) AS physical_address
FROM query_table(tokens) AS vt
JOIN root_table AS r ON r.seq_id = vt.seq_id
JOIN swapped_block AS s
  ON s.block_table_id = r.block_table_ptr AND s.block_index = vt.block_index;

-- name: resolved_kv_address_gpu
-- Rule 1 on the stored tokens: every token whose block is resident.
CREATE OR REPLACE VIEW resolved_kv_address_gpu AS
SELECT * FROM pagedkv_resolve_gpu('virtual_token');

-- name: resolved_kv_address_cpu
-- Rule 2 on the stored tokens: every token whose block is swapped out.
CREATE OR REPLACE VIEW resolved_kv_address_cpu AS
SELECT * FROM pagedkv_resolve_cpu('virtual_token');

-- name: resolved_kv_address
-- The spec's output relation: the set union of both rules.
CREATE OR REPLACE VIEW resolved_kv_address AS
SELECT seq_id, token_pos, physical_address FROM resolved_kv_address_gpu
UNION
SELECT seq_id, token_pos, physical_address FROM resolved_kv_address_cpu;

-- name: resolve_sorted
-- What `resolve` runs: both rules as a bag, sorted. Duplicates can only come out next to
-- each other, so the reader drops them on the fly instead of hashing the whole output.
SELECT seq_id, token_pos, physical_address FROM (
    SELECT * FROM resolved_kv_address_gpu
    UNION ALL
    SELECT * FROM resolved_kv_address_cpu
) ORDER BY seq_id, token_pos, physical_address;

-- name: resolve_group_sorted
-- What `resolve --group N` runs: the tokens KV-cache group N keeps (engine_group_token),
-- each at the block its entry holds (base + block_id * block_step + offset, the same
-- arithmetic as the spec's relations), sorted; from an engine import's tables (the
-- macro pagedkv_resolve_group of sql/engines.sql). Parameter: the group.
SELECT seq_id, token_pos, physical_address FROM pagedkv_resolve_group(?)
ORDER BY seq_id, token_pos, physical_address;

-- name: resolve_bag_is_set
-- Whether resolve_sorted's bag can hold no row twice, so that it is the spec's set as it
-- is: every token key, root_table seq_id and block key unique, and no block key both
-- resident and swapped (then each token has at most one row). True proves it; false
-- proves nothing (keys unique but not in scan order, a block in both tables).
-- Plan: four streaming lag() passes in scan order (no sort, no hash; the keys strictly
-- increasing, one chain) and one hash join of the two block tables' keys (the swapped
-- ones built).
SELECT (SELECT ascending FROM pagedkv_block_keys_ascending('pagedkv_token_keys'))
   AND (SELECT ascending FROM pagedkv_block_keys_ascending('block_table_entry'))
   AND (SELECT ascending FROM pagedkv_block_keys_ascending('swapped_block'))
   AND (SELECT count(*) FILTER (WHERE prev IS NULL) <= 1
               AND count(*) FILTER (WHERE prev IS NOT NULL AND seq_id <= prev) = 0
        FROM (SELECT seq_id, lag(seq_id) OVER () AS prev FROM root_table))
   AND NOT EXISTS (SELECT 1 FROM block_table_entry AS b
                   JOIN swapped_block AS s USING (block_table_id, block_index))
   AS bag_is_set;
