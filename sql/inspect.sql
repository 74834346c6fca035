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
-- Plan: no hash of every token. A set of integers is kept as 64-bit words: the key with its
-- low 6 bits dropped (x >> 6, arithmetic, so exact for negatives too) and a bitmap of those
-- bits (1 << (x & 63)); its size is the sum of the words' popcounts, however often a value
-- is repeated (exact duplicates from a DuckDB shell count once), and the set operations on
-- logical blocks are AND/OR/AND NOT of the words. The tokens are read in one aggregate by
-- (seq_id, block word, position word): 1/64 of the groups of a DISTINCT. Physical bases are
-- words of base >> 8 per (base >> 14, base & 255): exact for any value, dense when aligned.
-- Distinct (slot, base) mappings are hashed only in the words where a slot has two rows.
WITH bs AS (SELECT ?::BIGINT AS b),
tok AS (
    SELECT seq_id, block_index >> 6 AS bhi, token_pos >> 6 AS thi,
           bit_or(1::UBIGINT << (block_index & 63)) AS bbits,
           bit_or(1::UBIGINT << (token_pos & 63)) AS tbits,
           max(token_pos) AS last
    FROM virtual_token GROUP BY ALL
),
tokens AS (SELECT bit_or(tbits) AS bits FROM tok GROUP BY seq_id, thi),
lengths AS (SELECT max(last)::HUGEINT + 1 AS len FROM tok GROUP BY seq_id),
resident AS (
    SELECT block_table_id AS t, block_index >> 6 AS hi,
           bit_or(1::UBIGINT << (block_index & 63)) AS bits, count(*) AS n
    FROM block_table_entry GROUP BY ALL
),
copies AS (
    SELECT block_table_id AS t, block_index >> 6 AS hi,
           bit_or(1::UBIGINT << (block_index & 63)) AS bits
    FROM swapped_block GROUP BY ALL
),
wanted AS (
    SELECT r.block_table_ptr AS t, k.bhi AS hi, bit_or(k.bbits) AS bits
    FROM tok k JOIN root_table r USING (seq_id) GROUP BY ALL
),
logical AS (
    SELECT coalesce(r.bits, 0::UBIGINT) AS r, coalesce(c.bits, 0::UBIGINT) AS c,
           coalesce(w.bits, 0::UBIGINT) AS w
    FROM resident r FULL JOIN copies c USING (t, hi) FULL JOIN wanted w USING (t, hi)
),
blocks AS (
    SELECT coalesce(sum(bit_count(r::HUGEINT)), 0) AS resident,
           coalesce(sum(bit_count((c & ~r)::HUGEINT)), 0) AS swapped,
           coalesce(sum(bit_count((w & ~(r | c))::HUGEINT)), 0) AS missing,
           coalesce(sum(bit_count((r & c)::HUGEINT)), 0) AS with_copy
    FROM logical
),
gpu AS (
    SELECT coalesce(sum(bit_count(bits::HUGEINT)), 0) AS n FROM (
        SELECT bit_or(1::UBIGINT << ((physical_block_base >> 8) & 63)) AS bits
        FROM block_table_entry GROUP BY physical_block_base >> 14, physical_block_base & 255
    )
),
cpu AS (
    SELECT coalesce(sum(bit_count(bits::HUGEINT)), 0) AS n FROM (
        SELECT bit_or(1::UBIGINT << ((cpu_base_address >> 8) & 63)) AS bits
        FROM swapped_block GROUP BY cpu_base_address >> 14, cpu_base_address & 255
    )
),
mappings AS (
    SELECT (SELECT coalesce(sum(n), 0) FROM resident WHERE n = bit_count(bits::HUGEINT))
         + (SELECT count(*) FROM (
                SELECT DISTINCT block_table_id, block_index, physical_block_base
                FROM block_table_entry b
                SEMI JOIN (SELECT t, hi FROM resident WHERE n <> bit_count(bits::HUGEINT)) d
                       ON d.t = b.block_table_id AND d.hi = b.block_index >> 6
            )) AS n
)
SELECT
    (SELECT count(DISTINCT seq_id) FROM root_table) AS sequences,
    (SELECT coalesce(sum(bit_count(bits::HUGEINT)), 0) FROM tokens) AS tokens,
    blocks.resident + blocks.swapped + blocks.missing AS logical_blocks,
    blocks.resident AS resident_blocks,
    blocks.swapped AS swapped_blocks,
    blocks.missing AS missing_blocks,
    blocks.with_copy AS resident_blocks_with_cpu_copy,
    gpu.n AS physical_gpu_blocks,
    cpu.n AS physical_cpu_blocks,
    mappings.n - gpu.n AS blocks_saved_by_sharing,
    (SELECT coalesce(sum(((b - len % b) % b + b) % b), 0) FROM lengths, bs WHERE len > 0)
        AS unused_token_slots_in_last_blocks,
    (SELECT b FROM bs) AS block_size_tokens,
    256 * gpu.n::HUGEINT AS gpu_bytes,
    256 * cpu.n::HUGEINT AS cpu_bytes
FROM blocks, gpu, cpu, mappings;

-- name: kv_group_stats
-- After an engine import that recorded KV-cache groups (vLLM), one row a group: its kind,
-- block size, window, layers, whether the spec's relations are its, the requests with an
-- entry in it, its entries, the distinct blocks they hold (one pool: a block belongs to one
-- group at a time) and its placeholders (entries holding no block: the null block, a hole;
-- a sliding window's dropped entries, padding of a prefix hit, a Mamba group's passed
-- states).
-- Plan: one aggregate of the block lists by group, joined to the few group rows.
WITH entries AS (
    SELECT bt.group_id, bt.seq_id, bt.block_id,
           bt.block_id IS NULL OR coalesce(z.is_null, false) AS placeholder
    FROM engine_block_table bt
    LEFT JOIN engine_block z ON z.pool_id = bt.pool_id AND z.block_id = bt.block_id
), counted AS (
    SELECT group_id, count(DISTINCT seq_id) AS requests, count(*) AS entries,
           count(DISTINCT block_id) FILTER (WHERE NOT placeholder) AS blocks,
           count(*) FILTER (WHERE placeholder) AS placeholders
    FROM entries GROUP BY group_id
)
SELECT k.group_id, k.kind, k.block_size, k.window_tokens, k.layers, k.is_primary,
       coalesce(c.requests, 0), coalesce(c.entries, 0), coalesce(c.blocks, 0),
       coalesce(c.placeholders, 0)
FROM engine_kv_group k LEFT JOIN counted c USING (group_id)
ORDER BY k.group_id;

-- name: refcount_histogram
-- How many distinct physical bases carry each refcount.
-- Plan: the bases as 64-bit words, as in `stats`: one small aggregate, no hash of every base.
SELECT refcount, sum(bit_count(bits::HUGEINT)) AS physical_blocks FROM (
    SELECT refcount, bit_or(1::UBIGINT << ((physical_block_base >> 8) & 63)) AS bits
    FROM block_table_entry
    GROUP BY refcount, physical_block_base >> 14, physical_block_base & 255
)
GROUP BY refcount ORDER BY refcount;

-- name: pool_stats
-- Each engine pool's blocks after an import, one row a pool, in disjoint groups: held by a
-- request (in its block list, or a radix-tree page a request locks), cached (kept by the
-- prefix cache, no request holding it: reclaimable), free (in the free list, not cached),
-- reserved (the null block, the padding page), and unaccounted (the pool's blocks in none
-- of these: leaked, where the engine accounts for every block). Without a free list, free
-- is the allocator's own count (TensorRT-LLM), else NULL; unaccounted is NULL without a
-- free list, a pool size, or (SGLang) the radix tree.
-- Plan: a few thousand rows an engine's blocks; DISTINCT per group, anti joins in order.
WITH reserved AS (
    SELECT DISTINCT pool_id, block_id FROM engine_block WHERE is_null
),
held AS (
    SELECT pool_id, block_id FROM engine_block_table WHERE block_id IS NOT NULL
    UNION
    SELECT pool_id, block_id FROM engine_block WHERE lock_ref > 0 AND NOT is_null
),
held_real AS (SELECT * FROM held ANTI JOIN reserved USING (pool_id, block_id)),
cached AS (
    SELECT DISTINCT pool_id, block_id FROM engine_block
    ANTI JOIN held_real USING (pool_id, block_id)
    WHERE (block_hash IS NOT NULL OR lock_ref = 0) AND NOT is_null
),
free AS (
    SELECT DISTINCT pool_id, block_id FROM engine_free_block
    ANTI JOIN held_real USING (pool_id, block_id)
    ANTI JOIN cached USING (pool_id, block_id)
    ANTI JOIN reserved USING (pool_id, block_id)
),
recorded AS (
    SELECT
        bool_or(name = 'free_queue') AS free_list,
        bool_or(name = 'tree_pages') OR NOT bool_or(name = 'engine' AND value = 'sglang')
            AS every_cache_page
    FROM engine_info
),
counts AS (
    SELECT p.pool_id, p.name, p.tier, p.num_blocks, p.free_count,
           (SELECT count(*) FROM held_real h WHERE h.pool_id = p.pool_id) AS held,
           (SELECT count(*) FROM cached c WHERE c.pool_id = p.pool_id) AS cached,
           (SELECT count(*) FROM free f WHERE f.pool_id = p.pool_id) AS free,
           (SELECT count(*) FROM reserved r WHERE r.pool_id = p.pool_id) AS reserved
    FROM engine_pool p
)
SELECT pool_id, name, tier, num_blocks AS blocks, held, cached,
       CASE WHEN free_list THEN free ELSE free_count END AS free, reserved,
       CASE WHEN free_list AND every_cache_page
            THEN num_blocks - held - cached - free - reserved END AS unaccounted
FROM counts, recorded
ORDER BY pool_id;
