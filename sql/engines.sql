-- A serving engine's state beside the spec's relations (docs/engines.md).
-- `pagedkv-sql import ENGINE PATH` fills the engine_* tables from a snapshot and derives
-- the spec's four relations from them with the engine_to_* queries below, in one
-- transaction. The spec's tables keep the spec's meaning; what the spec has no place for
-- (request ids, free queue, block hashes, radix lock_ref, pools, tensor layouts) lives here.
-- Every `diag_engine_*` view is an engine invariant: a warning of `check` (an error under
-- --strict) that names request ids and block ids. These statements run only when an
-- engine snapshot is imported: the core never needs them.

-- name: create_engine_info
-- What was imported: engine, source file, block size, how block bases were computed.
CREATE TABLE IF NOT EXISTS engine_info (
    name  VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

-- name: create_engine_request
-- One row per engine request (sequence): its engine id beside the spec's seq_id, the
-- engine's own row for it (worker row, req_pool_idx, batch index), and its token counts.
CREATE TABLE IF NOT EXISTS engine_request (
    seq_id              BIGINT NOT NULL,
    request_id          VARCHAR NOT NULL,
    engine_row          BIGINT,
    num_tokens          BIGINT NOT NULL,
    num_computed_tokens BIGINT
);

-- name: create_engine_pool
-- A memory pool of blocks. tier 'gpu' pools give block_table_entry rows, 'cpu' pools
-- swapped_block rows, 'disk' pools (TensorRT-LLM's tertiary pool) none. base + block_id * block_step is a block's address in the spec's
-- relations: pointer and block_bytes when both are known and 256-aligned, else see
-- docs/engines.md. free_count: the allocator's own count of free blocks, when recorded.
CREATE TABLE IF NOT EXISTS engine_pool (
    pool_id     BIGINT NOT NULL,
    name        VARCHAR NOT NULL,
    tier        VARCHAR NOT NULL CHECK (tier IN ('gpu', 'cpu', 'disk')),
    pointer     BIGINT,
    block_bytes BIGINT,
    num_blocks  BIGINT,
    base        BIGINT NOT NULL,
    block_step  BIGINT NOT NULL,
    free_count  BIGINT
);

-- name: create_engine_block_table
-- Each request's block list exactly as the engine holds it: duplicates kept, a hole (no
-- block: a page fault) as a NULL block_id. group_id 0 is the block table the spec's
-- relations get; other groups (vLLM KV-cache groups, TensorRT-LLM pools) stay here.
CREATE TABLE IF NOT EXISTS engine_block_table (
    seq_id      BIGINT NOT NULL,
    group_id    BIGINT NOT NULL,
    block_index BIGINT NOT NULL,
    pool_id     BIGINT NOT NULL,
    block_id    BIGINT
);

-- name: create_engine_block
-- Every block the engine's allocator knows, with its own bookkeeping: ref_cnt (vLLM),
-- block hash, radix-tree lock_ref (SGLang), and whether it is the null block.
CREATE TABLE IF NOT EXISTS engine_block (
    pool_id    BIGINT NOT NULL,
    block_id   BIGINT NOT NULL,
    ref_cnt    BIGINT,
    block_hash VARCHAR,
    lock_ref   BIGINT,
    is_null    BOOLEAN NOT NULL DEFAULT false
);

-- name: create_engine_free_block
-- The allocator's free queue (or free list) in order.
CREATE TABLE IF NOT EXISTS engine_free_block (
    pool_id  BIGINT NOT NULL,
    position BIGINT NOT NULL,
    block_id BIGINT NOT NULL
);

-- name: create_engine_token_slot
-- Engines that map each token to a flat KV slot (SGLang's req_to_token): the slot of each
-- token. Block = slot // block_size, offset_in_block = slot % block_size.
CREATE TABLE IF NOT EXISTS engine_token_slot (
    seq_id    BIGINT NOT NULL,
    token_pos BIGINT NOT NULL,
    slot      BIGINT NOT NULL
);

-- name: create_engine_cache_tensor
-- A KV-cache tensor as recorded by the engine: data pointer, shape, strides (elements),
-- dtype, and what each dimension means (docs/engines.md, "Byte addresses").
CREATE TABLE IF NOT EXISTS engine_cache_tensor (
    name     VARCHAR NOT NULL,
    pool_id  BIGINT NOT NULL,
    layer    BIGINT,
    kv       BIGINT,
    pointer  BIGINT,
    dtype    VARCHAR NOT NULL,
    itemsize BIGINT NOT NULL,
    shape    BIGINT[] NOT NULL,
    strides  BIGINT[] NOT NULL,
    dims     VARCHAR[] NOT NULL
);

-- name: engine_to_root_table
-- One block table per request: block_table_ptr = seq_id.
SELECT DISTINCT seq_id, seq_id AS block_table_ptr FROM engine_request;

-- name: engine_to_block_table_entry
-- The primary group's resident blocks (pagedkv_primary_group: group 0 unless the import
-- recorded KV-cache groups): base = pool base + block_id * block_step; refcount = the
-- engine's ref_cnt where it keeps one, else the number of block-table slots holding the
-- block. Holes and the null block give no row (a placeholder holds no block).
-- Plan: one window count per (pool, block) over the group's list, one hash join each with
-- the pools and the block bookkeeping; no per-token work.
WITH listed AS (
    SELECT bt.seq_id, bt.block_index, bt.pool_id, bt.block_id,
           count(*) OVER (PARTITION BY bt.pool_id, bt.block_id) AS holders
    FROM engine_block_table bt
    WHERE bt.group_id = pagedkv_primary_group() AND bt.block_id IS NOT NULL
)
SELECT l.seq_id AS block_table_id, l.block_index,
       p.base + l.block_id * p.block_step AS physical_block_base,
       coalesce(b.ref_cnt, l.holders) AS refcount
FROM listed l
JOIN engine_pool p ON p.pool_id = l.pool_id AND p.tier = 'gpu'
LEFT JOIN engine_block b ON b.pool_id = l.pool_id AND b.block_id = l.block_id
WHERE NOT coalesce(b.is_null, false);

-- name: engine_to_swapped_block
-- The primary group's blocks in a CPU pool: cpu_base_address = pool base + block_id *
-- block_step.
SELECT bt.seq_id AS block_table_id, bt.block_index,
       p.base + bt.block_id * p.block_step AS cpu_base_address
FROM engine_block_table bt
JOIN engine_pool p ON p.pool_id = bt.pool_id AND p.tier = 'cpu'
WHERE bt.group_id = pagedkv_primary_group() AND bt.block_id IS NOT NULL;

-- name: engine_to_virtual_token
-- The tokens the primary group keeps of each request: positions [start, num_tokens), start
-- from the group's kind (pagedkv_kept_start: 0 for full attention, so every token; a
-- sliding window's tokens only, for a model whose layers all slide), block_index = pos //
-- B, offset = pos % B; except where the engine records a flat slot per token: there offset
-- = slot % B, so a slot in the wrong place of its page shows as a wrong decomposition (the
-- kept positions of them: SGLang's all-sliding-window cache keeps a slot per position).
-- Parameter: B.
-- Plan: range() per request generates the tokens without reading any; the slots table
-- (empty for block-list engines) replaces the requests it covers.
WITH bs AS (SELECT ?::BIGINT AS b),
slotted AS (SELECT DISTINCT seq_id FROM engine_token_slot),
grp AS (
    SELECT any_value(kind) AS kind, any_value(window_tokens) AS w
    FROM engine_kv_group WHERE group_id = pagedkv_primary_group()
)
SELECT r.seq_id, t.pos AS token_pos, t.pos // bs.b AS block_index,
       t.pos % bs.b AS offset_in_block
FROM engine_request r, bs, grp,
     LATERAL range(pagedkv_kept_start(grp.kind, grp.w, r.num_tokens), r.num_tokens) t(pos)
WHERE r.seq_id NOT IN (SELECT seq_id FROM slotted)
UNION ALL
SELECT s.seq_id, s.token_pos, s.token_pos // bs.b, s.slot % bs.b
FROM engine_token_slot s JOIN engine_request r USING (seq_id), bs, grp
WHERE s.token_pos >= pagedkv_kept_start(grp.kind, grp.w, r.num_tokens);

-- name: create_engine_csr_row
-- A CSR page table's row per sequence as the engine holds it (FlashInfer's kv_indptr
-- [i], kv_indptr[i+1] and kv_last_page_len[i]), kept raw so that the invariants can be
-- checked on what the engine has, not on what import made of it.
CREATE TABLE IF NOT EXISTS engine_csr_row (
    seq_id        BIGINT NOT NULL,
    indptr_begin  BIGINT NOT NULL,
    indptr_end    BIGINT NOT NULL,
    last_page_len BIGINT NOT NULL
);

-- name: create_engine_request_hash
-- vLLM's prefix-cache hash of each full block of a request (Request.block_hashes at the
-- group's block size, with the group id vLLM appends), as block_index: held block i's own
-- block_hash must be the request's hash i (diag_engine_prefix_hash). NULL where the
-- held block carries a partial-prefix hash instead (vLLM's fine-grained Mamba hits).
CREATE TABLE IF NOT EXISTS engine_request_hash (
    seq_id      BIGINT NOT NULL,
    group_id    BIGINT NOT NULL,
    block_index BIGINT NOT NULL,
    block_hash  VARCHAR
);

-- name: create_engine_kv_group
-- The KV-cache groups of the import (vLLM's kv_cache_config.kv_cache_groups), one row a
-- group: its kind (full_attention, sliding_window, chunked_local_attention, mamba; NULL
-- where the snapshot did not record it), its block size, its window (the sliding window W,
-- or the chunk C of chunked local attention), its layers' names, and whether it is the
-- primary group, the one the spec's relations describe (docs/engines.md, "KV-cache groups").
-- Engines that record no groups leave it empty: their group 0 is the primary one.
CREATE TABLE IF NOT EXISTS engine_kv_group (
    group_id      BIGINT NOT NULL,
    kind          VARCHAR CHECK (kind IN ('full_attention', 'sliding_window',
                                          'chunked_local_attention', 'mamba')),
    block_size    BIGINT NOT NULL CHECK (block_size > 0),
    window_tokens BIGINT CHECK (window_tokens > 0),
    layers        VARCHAR[] NOT NULL,
    is_primary    BOOLEAN NOT NULL
);

-- name: macro_engine_primary_group
-- The group the spec's relations describe: engine_kv_group's primary one, else group 0.
CREATE OR REPLACE MACRO pagedkv_primary_group() AS
    coalesce((SELECT min(group_id) FROM engine_kv_group WHERE is_primary), 0);

-- name: engine_view_request_label
-- The engine's request id of each seq_id: `check` and `explain` show it beside seq_id
-- (and block_table_id, which is the seq_id after an import).
CREATE OR REPLACE VIEW pagedkv_request_label AS
SELECT seq_id, min(request_id) AS request_id FROM engine_request GROUP BY seq_id;

-- name: engine_view_holds
-- Every hold of a block: an entry of a request's block list, with the request id. A hole
-- (NULL) and the null block (a placeholder: "no block here") hold nothing.
CREATE OR REPLACE VIEW engine_holds AS
SELECT bt.seq_id, r.request_id, bt.group_id, bt.block_index, bt.pool_id, bt.block_id
FROM engine_block_table bt LEFT JOIN pagedkv_request_label r USING (seq_id)
WHERE bt.block_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM engine_block z
                  WHERE z.is_null AND z.pool_id = bt.pool_id AND z.block_id = bt.block_id);

-- name: engine_view_group_tokens
-- The tokens each KV-cache group keeps of each request, in that group's blocks: the
-- primary group's are virtual_token's; another group's are the positions [start,
-- num_tokens) its kind keeps (pagedkv_kept_start), block_index = pos // the group's block
-- size. Groups without a recorded kind (and every group of an engine that records none)
-- keep every token at the import's block size. What `resolve --group` and the byte
-- addresses of a layer read.
-- Plan: range() per request and group generates the tokens; filtered by group_id first.
CREATE OR REPLACE VIEW engine_group_token AS
WITH groups AS (
    SELECT DISTINCT bt.group_id FROM engine_block_table bt
    UNION
    SELECT group_id FROM engine_kv_group
), described AS (
    SELECT g.group_id, k.kind, k.window_tokens AS w,
           coalesce(k.block_size,
                    (SELECT value FROM pagedkv_settings WHERE name = 'block_size')) AS b
    FROM groups g LEFT JOIN engine_kv_group k USING (group_id)
    WHERE g.group_id <> pagedkv_primary_group()
)
SELECT pagedkv_primary_group() AS group_id, seq_id, token_pos, block_index, offset_in_block
FROM virtual_token
UNION ALL
SELECT d.group_id, r.seq_id, t.pos, t.pos // d.b, t.pos % d.b
FROM described d, engine_request r,
     LATERAL range(pagedkv_kept_start(d.kind, d.w, r.num_tokens), r.num_tokens) t(pos);

-- name: diag_engine_refcount_mismatch
-- A block whose engine ref_cnt is not the number of block-list entries holding it (a
-- leak, or a double free waiting to happen); the null block aside.
-- Plan: one aggregate of the holds by block, a full join with the blocks that keep a
-- ref_cnt; only the blocks that disagree are described.
CREATE OR REPLACE VIEW diag_engine_refcount_mismatch AS
WITH held AS (
    SELECT pool_id, block_id, count(*) AS holders,
           string_agg(DISTINCT request_id, ' ' ORDER BY request_id) AS request_ids
    FROM engine_holds GROUP BY ALL
)
SELECT b.pool_id, b.block_id, b.ref_cnt, coalesce(h.holders, 0) AS holders,
       coalesce(h.request_ids, '') AS request_ids,
       'ref_cnt ' || b.ref_cnt || ' but ' || coalesce(h.holders, 0)
           || ' block-list entr' || CASE WHEN coalesce(h.holders, 0) = 1 THEN 'y' ELSE 'ies' END
           || ' hold block ' || b.block_id AS reason
FROM engine_block b LEFT JOIN held h USING (pool_id, block_id)
WHERE b.ref_cnt IS NOT NULL AND NOT b.is_null AND b.ref_cnt <> coalesce(h.holders, 0);

-- name: diag_engine_free_queue_ref_cnt
-- A block with ref_cnt 0 that is not in the free queue (lost to the allocator), or one in
-- the free queue with ref_cnt > 0 (it can be handed out while in use); the null block aside.
-- Only when the snapshot recorded the free queue (engine_info free_queue = recorded).
CREATE OR REPLACE VIEW diag_engine_free_queue_ref_cnt AS
WITH free AS (SELECT DISTINCT pool_id, block_id FROM engine_free_block)
SELECT b.pool_id, b.block_id, b.ref_cnt, f.block_id IS NOT NULL AS in_free_queue,
       CASE WHEN f.block_id IS NULL
            THEN 'block ' || b.block_id || ' has ref_cnt 0 but is not in the free queue'
            ELSE 'block ' || b.block_id || ' is in the free queue with ref_cnt ' || b.ref_cnt
       END AS reason
FROM engine_block b LEFT JOIN free f USING (pool_id, block_id)
WHERE b.ref_cnt IS NOT NULL AND NOT b.is_null
  AND (b.ref_cnt = 0) <> (f.block_id IS NOT NULL)
  AND EXISTS (SELECT 1 FROM engine_info WHERE name = 'free_queue' AND value = 'recorded');

-- name: diag_engine_held_free_block
-- A block held by a request while it is also in the free queue: the next allocation hands
-- it to another request, whose tokens overwrite this one's (a use after free).
CREATE OR REPLACE VIEW diag_engine_held_free_block AS
WITH free AS (
    SELECT pool_id, block_id, min(position) AS free_queue_position
    FROM engine_free_block GROUP BY ALL
)
SELECT h.seq_id, h.request_id, h.group_id, h.block_index, h.pool_id, h.block_id,
       f.free_queue_position,
       'request ' || coalesce(h.request_id, h.seq_id::VARCHAR) || ' holds block '
           || h.block_id || ', which is in the free queue at position '
           || f.free_queue_position AS reason
FROM engine_holds h JOIN free f USING (pool_id, block_id);

-- name: diag_engine_duplicate_block
-- One block twice in one request's block list: freeing the request frees it twice.
CREATE OR REPLACE VIEW diag_engine_duplicate_block AS
SELECT seq_id, request_id, group_id, pool_id, block_id,
       list(block_index ORDER BY block_index) AS block_indices,
       'request ' || coalesce(request_id, seq_id::VARCHAR) || ' lists block ' || block_id
           || ' ' || count(*) || ' times' AS reason
FROM engine_holds
GROUP BY seq_id, request_id, group_id, pool_id, block_id
HAVING count(*) > 1;

-- name: diag_engine_free_list_duplicate
-- A block in the free queue more than once: it can be handed to two requests.
CREATE OR REPLACE VIEW diag_engine_free_list_duplicate AS
SELECT pool_id, block_id, list(position ORDER BY position) AS positions,
       'block ' || block_id || ' is in the free queue ' || count(*) || ' times' AS reason
FROM engine_free_block
GROUP BY pool_id, block_id
HAVING count(*) > 1;

-- name: diag_engine_free_count
-- A pool whose allocator counts another number of free blocks than its free queue holds
-- (or, without a recorded queue, than the blocks no request holds, null block aside): a
-- corrupted counter (TensorRT-LLM #11879) admits requests the cache cannot hold.
CREATE OR REPLACE VIEW diag_engine_free_count AS
WITH held AS (
    SELECT pool_id, count(DISTINCT block_id) AS n FROM engine_holds GROUP BY pool_id
), queued AS (
    SELECT pool_id, count(*) AS n FROM engine_free_block GROUP BY pool_id
), nulls AS (
    SELECT pool_id, count(*) AS n FROM engine_block WHERE is_null GROUP BY pool_id
), expected AS (
    SELECT p.pool_id, p.name, p.free_count,
           CASE WHEN EXISTS (SELECT 1 FROM engine_info
                             WHERE name = 'free_queue' AND value = 'recorded')
                THEN coalesce(q.n, 0)
                ELSE p.num_blocks - coalesce(h.n, 0) - coalesce(z.n, 0) END AS counted,
           EXISTS (SELECT 1 FROM engine_info
                   WHERE name = 'free_queue' AND value = 'recorded') AS from_queue
    FROM engine_pool p
    LEFT JOIN held h USING (pool_id) LEFT JOIN queued q USING (pool_id)
    LEFT JOIN nulls z USING (pool_id)
    WHERE p.free_count IS NOT NULL
)
SELECT pool_id, name, free_count, counted,
       name || ' counts ' || free_count || ' free blocks, but '
           || CASE WHEN from_queue THEN 'its free queue holds ' || counted
                   ELSE counted || ' of its blocks are held by no request' END AS reason
FROM expected
WHERE counted IS NOT NULL AND free_count <> counted;

-- name: diag_engine_disk_block
-- A block a request holds in a disk pool (TensorRT-LLM's tertiary pool): the spec has no
-- disk tier, so it gives no row of the spec's relations and its tokens resolve to no address
-- (diag_unresolved_token lists them) until the engine brings it back to GPU or host memory.
CREATE OR REPLACE VIEW diag_engine_disk_block AS
SELECT h.seq_id, h.request_id, h.group_id, h.block_index, h.pool_id, h.block_id,
       'request ' || coalesce(h.request_id, h.seq_id::VARCHAR) || ' holds block '
           || h.block_id || ' (block index ' || h.block_index || ') in ' || p.name
           || ', on disk: no tier of the spec holds it' AS reason
FROM engine_holds h JOIN engine_pool p USING (pool_id)
WHERE p.tier = 'disk';

-- name: diag_engine_outside_pool
-- A block id or token slot outside its pool: negative, or beyond the pool's blocks; or the
-- null block (reserved: a placeholder, never a block of its own) in the free queue, from
-- where the next allocation hands it out as a real block.
CREATE OR REPLACE VIEW diag_engine_outside_pool AS
WITH bs AS (SELECT value AS b FROM pagedkv_settings WHERE name = 'block_size'),
used AS (
    SELECT h.seq_id, h.request_id, NULL::BIGINT AS token_pos, h.pool_id, h.block_id,
           NULL::BIGINT AS slot
    FROM engine_holds h
    UNION ALL
    SELECT NULL, NULL, NULL, pool_id, block_id, NULL FROM engine_free_block
    UNION ALL
    SELECT s.seq_id, r.request_id, s.token_pos, 0, s.slot // bs.b, s.slot
    FROM engine_token_slot s CROSS JOIN bs LEFT JOIN pagedkv_request_label r USING (seq_id)
), reserved AS (
    SELECT DISTINCT pool_id, block_id FROM engine_block WHERE is_null
)
SELECT u.seq_id, u.request_id, u.token_pos, u.pool_id, u.block_id, u.slot,
       p.num_blocks,
       CASE WHEN z.block_id IS NOT NULL AND u.slot IS NULL
                THEN 'block ' || u.block_id || ' is the null block of pool ' || u.pool_id
                     || ' (reserved: a placeholder)'
            ELSE CASE WHEN u.slot IS NOT NULL THEN 'slot ' || u.slot
                      ELSE 'block ' || u.block_id END
                 || ' is outside pool ' || u.pool_id || ' ('
                 || coalesce(p.num_blocks::VARCHAR || ' blocks', 'ids >= 0') || ')' END
           || CASE WHEN u.request_id IS NULL THEN ' (free queue)'
                   ELSE ' (request ' || u.request_id || ')' END AS reason
FROM used u LEFT JOIN engine_pool p USING (pool_id)
LEFT JOIN reserved z ON z.pool_id = u.pool_id AND z.block_id = u.block_id
WHERE u.block_id < 0 OR u.slot < 0 OR u.block_id >= p.num_blocks
   OR (z.block_id IS NOT NULL AND u.slot IS NULL AND u.seq_id IS NULL);

-- name: diag_engine_slot_page_offset
-- A token whose slot sits at another place of its page than its position does
-- (slot % page_size <> pos % page_size): SGLang's paged allocator never does that.
CREATE OR REPLACE VIEW diag_engine_slot_page_offset AS
WITH bs AS (SELECT value AS b FROM pagedkv_settings WHERE name = 'block_size')
SELECT s.seq_id, r.request_id, s.token_pos, s.slot,
       'token ' || s.token_pos || ' of request ' || coalesce(r.request_id, s.seq_id::VARCHAR)
           || ' is in slot ' || s.slot || ': slot % ' || bs.b || ' = ' || (s.slot % bs.b)
           || ', pos % ' || bs.b || ' = ' || (s.token_pos % bs.b) AS reason
FROM engine_token_slot s CROSS JOIN bs LEFT JOIN pagedkv_request_label r USING (seq_id)
WHERE s.slot % bs.b <> s.token_pos % bs.b;

-- name: diag_engine_csr_row
-- A FlashInfer sequence whose kv_indptr goes backwards (or does not start at 0), or whose
-- kv_last_page_len is outside [1, page_size] though it has pages.
CREATE OR REPLACE VIEW diag_engine_csr_row AS
WITH bs AS (SELECT value AS b FROM pagedkv_settings WHERE name = 'block_size'),
first AS (SELECT min(seq_id) AS first_seq FROM engine_csr_row)
SELECT c.seq_id, r.request_id, c.indptr_begin, c.indptr_end, c.last_page_len,
       CASE WHEN c.indptr_end < c.indptr_begin
                THEN 'kv_indptr[' || c.seq_id + 1 || '] = ' || c.indptr_end || ' < kv_indptr['
                     || c.seq_id || '] = ' || c.indptr_begin || ' (not monotone)'
            WHEN c.seq_id = first.first_seq AND c.indptr_begin <> 0
                THEN 'kv_indptr[0] = ' || c.indptr_begin || ', not 0'
            ELSE 'kv_last_page_len[' || c.seq_id || '] = ' || c.last_page_len
                 || ' is outside [1, ' || bs.b || ']' END AS reason
FROM engine_csr_row c CROSS JOIN bs CROSS JOIN first
LEFT JOIN pagedkv_request_label r ON r.seq_id = c.seq_id
WHERE c.indptr_end < c.indptr_begin
   OR (c.seq_id = first.first_seq AND c.indptr_begin <> 0)
   OR (c.indptr_end > c.indptr_begin AND (c.last_page_len < 1 OR c.last_page_len > bs.b));

-- name: diag_engine_prefix_hash
-- A block a request holds at block index i whose prefix-cache hash is not the request's
-- hash i: a prefix hit that handed back the wrong block (or the right blocks in the wrong
-- order) has every count right, but the request reads another prefix's KV.
-- Plan: hash joins of the holds with the blocks and the request hashes on their keys; only
-- held blocks that carry a hash are compared.
CREATE OR REPLACE VIEW diag_engine_prefix_hash AS
SELECT h.seq_id, h.request_id, h.group_id, h.block_index, h.pool_id, h.block_id,
       b.block_hash, q.block_hash AS request_block_hash,
       'request ' || coalesce(h.request_id, h.seq_id::VARCHAR) || ' holds block '
           || h.block_id || ' at block index ' || h.block_index || ' with hash '
           || left(b.block_hash, 16) || ', but its hash ' || h.block_index || ' is '
           || left(q.block_hash, 16) AS reason
FROM engine_holds h
JOIN engine_block b USING (pool_id, block_id)
JOIN engine_request_hash q
  ON q.seq_id = h.seq_id AND q.group_id = h.group_id AND q.block_index = h.block_index
WHERE NOT b.is_null AND b.block_hash IS NOT NULL AND q.block_hash IS NOT NULL
  AND b.block_hash <> q.block_hash;

-- name: diag_engine_leak
-- A page (null page aside) not accounted for exactly once by the free list, the radix tree
-- and the rows' pages outside the tree: a page counted nowhere is leaked (SGLang #11970),
-- one counted twice can be handed out while in use. Only when the snapshot recorded the
-- radix tree (engine_info tree_pages = recorded) and the pool's size.
-- Plan: range() over each pool's pages, left hash joins with three aggregates (free list,
-- tree pages, held pages); only the pages whose count is not 1 are described.
CREATE OR REPLACE VIEW diag_engine_leak AS
WITH pages AS (
    SELECT p.pool_id, g.block_id
    FROM engine_pool p, LATERAL range(p.num_blocks) g(block_id)
    WHERE p.num_blocks IS NOT NULL
      AND EXISTS (SELECT 1 FROM engine_info WHERE name = 'tree_pages' AND value = 'recorded')
), free AS (
    SELECT pool_id, block_id, count(*) AS n FROM engine_free_block GROUP BY ALL
), tree AS (
    SELECT pool_id, block_id, count(*) AS n FROM engine_block
    WHERE lock_ref IS NOT NULL AND NOT is_null GROUP BY ALL
), held AS (
    SELECT pool_id, block_id,
           coalesce(string_agg(DISTINCT request_id, ' ' ORDER BY request_id), '') AS request_ids
    FROM engine_holds GROUP BY ALL
), counted AS (
    SELECT pg.pool_id, pg.block_id, coalesce(f.n, 0) AS free_times,
           coalesce(t.n, 0) AS tree_times, h.request_ids,
           coalesce(f.n, 0) + coalesce(t.n, 0)
               + CASE WHEN h.block_id IS NOT NULL AND t.block_id IS NULL THEN 1 ELSE 0 END
               AS covered
    FROM pages pg
    LEFT JOIN free f USING (pool_id, block_id)
    LEFT JOIN tree t USING (pool_id, block_id)
    LEFT JOIN held h USING (pool_id, block_id)
    WHERE NOT EXISTS (SELECT 1 FROM engine_block z
                      WHERE z.is_null AND z.pool_id = pg.pool_id AND z.block_id = pg.block_id)
)
SELECT pool_id, block_id, free_times, tree_times, coalesce(request_ids, '') AS request_ids,
       covered,
       CASE WHEN covered = 0
            THEN 'page ' || block_id || ' is neither free, in the radix tree, nor held by a '
                 || 'request (leaked)'
            ELSE 'page ' || block_id || ' is counted ' || covered || ' times: free '
                 || free_times || ', in the radix tree ' || tree_times
                 || CASE WHEN request_ids IS NULL THEN ''
                         ELSE ', held by ' || request_ids END END AS reason
FROM counted
WHERE covered <> 1;

-- name: diag_engine_tree_page_free
-- A page a radix-tree node holds that is also in the free list: the allocator hands it
-- out while the tree still serves it as a cached prefix.
CREATE OR REPLACE VIEW diag_engine_tree_page_free AS
WITH free AS (
    SELECT pool_id, block_id, min(position) AS free_position
    FROM engine_free_block GROUP BY ALL
)
SELECT b.pool_id, b.block_id, b.lock_ref, f.free_position,
       'page ' || b.block_id || ' is in the radix tree (lock_ref ' || b.lock_ref
           || ') and in the free list at position ' || f.free_position AS reason
FROM engine_block b JOIN free f USING (pool_id, block_id)
WHERE b.lock_ref IS NOT NULL AND NOT b.is_null;

-- name: diag_engine_lock_ref
-- A radix-tree page whose node's lock_ref is below the number of requests whose rows hold
-- it: the node can be evicted while they run (an uncounted lock on a cached prefix).
CREATE OR REPLACE VIEW diag_engine_lock_ref AS
WITH held AS (
    SELECT pool_id, block_id, count(DISTINCT seq_id) AS n,
           coalesce(string_agg(DISTINCT request_id, ' ' ORDER BY request_id), '') AS request_ids
    FROM engine_holds GROUP BY ALL
)
SELECT b.pool_id, b.block_id, b.lock_ref, h.n AS running, h.request_ids,
       'page ' || b.block_id || ' is in a radix-tree node with lock_ref ' || b.lock_ref
           || ' but ' || h.n || ' running request(s) hold it: ' || h.request_ids AS reason
FROM engine_block b JOIN held h USING (pool_id, block_id)
WHERE b.lock_ref IS NOT NULL AND NOT b.is_null AND b.lock_ref < h.n;

-- name: diag_engine_unresolved_token
-- A block-list entry a KV-cache group needs that holds no block: an entry covering a
-- position the group keeps of a request's computed tokens (pagedkv_kept_start: every token
-- for full attention, the window for a sliding window, the current chunk for chunked
-- local attention) that is a placeholder (the null block, or a hole) or missing past the
-- list's end: the token's KV is read from no block. An entry before the kept span may be a
-- placeholder (it left the window) or a block not yet freed. Mamba groups hold states,
-- not tokens: none is required. Only for the groups the import recorded.
-- Plan: range() over each request's required entries per group (a handful each), a hash
-- join with the lists on (seq_id, group_id, block_index); no per-token work.
CREATE OR REPLACE VIEW diag_engine_unresolved_token AS
WITH spans AS (
    SELECT r.seq_id, r.request_id, k.group_id, k.kind, k.window_tokens, k.block_size AS b,
           coalesce(r.num_computed_tokens, r.num_tokens) AS n
    FROM engine_request r CROSS JOIN engine_kv_group k
    WHERE k.kind IN ('full_attention', 'sliding_window', 'chunked_local_attention')
), kept AS (
    SELECT *, pagedkv_kept_start(kind, window_tokens, n) AS s FROM spans
), required AS (
    SELECT k.*, e.i AS block_index
    FROM kept k, LATERAL range(k.s // k.b, (k.n + k.b - 1) // k.b) e(i)
    WHERE k.s < k.n
), entries AS (
    SELECT bt.seq_id, bt.group_id, bt.block_index, bt.block_id
    FROM engine_block_table bt
    WHERE bt.block_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM engine_block z
                      WHERE z.is_null AND z.pool_id = bt.pool_id AND z.block_id = bt.block_id)
), listed AS (
    SELECT seq_id, group_id, max(block_index) + 1 AS length
    FROM engine_block_table GROUP BY ALL
)
SELECT q.seq_id, q.request_id, q.group_id, q.kind, q.block_index, q.n AS computed_tokens,
       greatest(q.block_index * q.b, q.s) AS first_token,
       least((q.block_index + 1) * q.b, q.n) - 1 AS last_token,
       'request ' || coalesce(q.request_id, q.seq_id::VARCHAR) || ' holds no block at entry '
           || q.block_index || ' of KV-cache group ' || q.group_id || ' (' || q.kind
           || CASE WHEN q.window_tokens IS NOT NULL AND q.kind <> 'full_attention'
                   THEN ' ' || q.window_tokens ELSE '' END || ', block size ' || q.b || '): '
           || CASE WHEN q.block_index < coalesce(l.length, 0) THEN 'a placeholder'
                   ELSE 'past the end of its ' || coalesce(l.length, 0) || '-entry list' END
           || ', though the group keeps tokens ' || greatest(q.block_index * q.b, q.s) || '..'
           || least((q.block_index + 1) * q.b, q.n) - 1 || ' of its ' || q.n
           || ' computed tokens there' AS reason
FROM required q
LEFT JOIN entries e USING (seq_id, group_id, block_index)
LEFT JOIN listed l USING (seq_id, group_id)
WHERE e.block_id IS NULL;

-- name: engine_alias_slot_outside_pool
-- The old name of diag_engine_outside_pool, kept for one release (invariants.RENAMED_VIEWS).
CREATE OR REPLACE VIEW diag_engine_slot_outside_pool AS SELECT * FROM diag_engine_outside_pool;

-- name: engine_alias_free_queue_duplicate
-- The old name of diag_engine_free_list_duplicate, kept for one release (invariants.RENAMED_VIEWS).
CREATE OR REPLACE VIEW diag_engine_free_queue_duplicate AS SELECT * FROM diag_engine_free_list_duplicate;

-- name: engine_alias_page_conservation
-- The old name of diag_engine_leak, kept for one release (invariants.RENAMED_VIEWS).
CREATE OR REPLACE VIEW diag_engine_page_conservation AS SELECT * FROM diag_engine_leak;

-- name: engine_alias_block_hash_mismatch
-- The old name of diag_engine_prefix_hash, kept for one release (invariants.RENAMED_VIEWS).
CREATE OR REPLACE VIEW diag_engine_block_hash_mismatch AS SELECT * FROM diag_engine_prefix_hash;

-- name: engine_alias_ref_cnt_mismatch
-- The old name of diag_engine_refcount_mismatch, kept for one release (invariants.RENAMED_VIEWS).
CREATE OR REPLACE VIEW diag_engine_ref_cnt_mismatch AS SELECT * FROM diag_engine_refcount_mismatch;

-- name: engine_alias_group_token_missing
-- The old name of diag_engine_unresolved_token, kept for one release (invariants.RENAMED_VIEWS).
CREATE OR REPLACE VIEW diag_engine_group_token_missing AS SELECT * FROM diag_engine_unresolved_token;

-- name: engine_view_findings
-- Every engine invariant's findings as one relation (check, reason, request ids, block id):
-- the engine checks in one query (engines/fastcheck.py's reference).
CREATE OR REPLACE VIEW engine_findings AS
SELECT 'diag_engine_refcount_mismatch' AS check_name, reason,
       list_filter(string_split(request_ids, ' '), lambda x: x <> '') AS request_ids,
       block_id
FROM diag_engine_refcount_mismatch
UNION ALL
SELECT 'diag_engine_free_queue_ref_cnt', reason, []::VARCHAR[], block_id
FROM diag_engine_free_queue_ref_cnt
UNION ALL
SELECT 'diag_engine_held_free_block', reason, list_filter([request_id], lambda x: x IS NOT NULL),
       block_id
FROM diag_engine_held_free_block
UNION ALL
SELECT 'diag_engine_duplicate_block', reason, list_filter([request_id], lambda x: x IS NOT NULL),
       block_id
FROM diag_engine_duplicate_block
UNION ALL
SELECT 'diag_engine_free_list_duplicate', reason, []::VARCHAR[], block_id
FROM diag_engine_free_list_duplicate
UNION ALL
SELECT 'diag_engine_free_count', reason, []::VARCHAR[], NULL::BIGINT FROM diag_engine_free_count
UNION ALL
SELECT 'diag_engine_disk_block', reason, list_filter([request_id], lambda x: x IS NOT NULL),
       block_id
FROM diag_engine_disk_block
UNION ALL
SELECT 'diag_engine_outside_pool', reason,
       list_filter([request_id], lambda x: x IS NOT NULL), block_id
FROM diag_engine_outside_pool
UNION ALL
SELECT 'diag_engine_slot_page_offset', reason,
       list_filter([request_id], lambda x: x IS NOT NULL), NULL::BIGINT
FROM diag_engine_slot_page_offset
UNION ALL
SELECT 'diag_engine_csr_row', reason, list_filter([request_id], lambda x: x IS NOT NULL),
       NULL::BIGINT
FROM diag_engine_csr_row
UNION ALL
SELECT 'diag_engine_prefix_hash', reason,
       list_filter([request_id], lambda x: x IS NOT NULL), block_id
FROM diag_engine_prefix_hash
UNION ALL
SELECT 'diag_engine_leak', reason,
       list_filter(string_split(request_ids, ' '), lambda x: x <> ''), block_id
FROM diag_engine_leak
UNION ALL
SELECT 'diag_engine_tree_page_free', reason, []::VARCHAR[], block_id
FROM diag_engine_tree_page_free
UNION ALL
SELECT 'diag_engine_lock_ref', reason,
       list_filter(string_split(request_ids, ' '), lambda x: x <> ''), block_id
FROM diag_engine_lock_ref
UNION ALL
SELECT 'diag_engine_unresolved_token', reason,
       list_filter([request_id], lambda x: x IS NOT NULL), NULL::BIGINT
FROM diag_engine_unresolved_token;

-- name: engine_view_layer_group
-- The KV-cache group of each layer: a cache tensor recorded under one of the group's layer
-- names gives its layer; else a layer name's one integer component is the layer (vLLM's
-- extract_layer_index: model.layers.3.self_attn.attn is layer 3). Empty without recorded
-- groups: then every layer is the primary group's.
CREATE OR REPLACE VIEW engine_layer_group AS
WITH names AS (
    SELECT k.group_id, k.kind, unnest(k.layers) AS layer_name FROM engine_kv_group k
), numbered AS (
    SELECT group_id, kind, layer_name,
           list_filter(string_split(layer_name, '.'),
                       lambda x: regexp_full_match(x, '[0-9]{1,9}')) AS numbers
    FROM names
)
SELECT DISTINCT t.layer, n.group_id, n.kind
FROM numbered n JOIN engine_cache_tensor t ON t.name = n.layer_name AND t.layer IS NOT NULL
UNION
SELECT DISTINCT numbers[1]::BIGINT, group_id, kind
FROM numbered n
WHERE len(numbers) = 1
  AND NOT EXISTS (SELECT 1 FROM engine_cache_tensor t
                  WHERE t.layer = numbers[1]::BIGINT
                    AND t.name IN (SELECT layer_name FROM names));

-- name: macro_engine_layer_group
-- The KV-cache group of a layer: engine_layer_group's (the smallest, should a layer be
-- named by two), else the primary group.
CREATE OR REPLACE MACRO pagedkv_layer_group(which_layer) AS
    coalesce((SELECT min(group_id) FROM engine_layer_group g WHERE g.layer = which_layer),
             pagedkv_primary_group());

-- name: macro_engine_resolve_group
-- The addresses of the tokens KV-cache group g keeps (`resolve --group g`): each token of
-- engine_group_token at its entry's block, base + block_id * block_step + offset in a GPU
-- or CPU pool (a disk pool, a hole or the null block: no address), as the spec's rules give
-- the primary group's.
-- Usage: SELECT * FROM pagedkv_resolve_group(g).
-- Plan: the group's tokens hash join their entries on (seq_id, block_index), then the pools.
CREATE OR REPLACE MACRO pagedkv_resolve_group(g) AS TABLE
SELECT t.seq_id, t.token_pos,
       CASE WHEN p.tier = 'cpu'
            THEN pagedkv_wrapping_add(p.base + bt.block_id * p.block_step, t.offset_in_block)
            ELSE p.base + bt.block_id * p.block_step + t.offset_in_block END
           AS physical_address
FROM engine_group_token t
JOIN engine_block_table bt
  ON bt.seq_id = t.seq_id AND bt.group_id = t.group_id AND bt.block_index = t.block_index
JOIN engine_pool p ON p.pool_id = bt.pool_id AND p.tier IN ('gpu', 'cpu')
WHERE t.group_id = g AND bt.block_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM engine_block z
                  WHERE z.is_null AND z.pool_id = bt.pool_id AND z.block_id = bt.block_id);

-- name: macro_engine_kv_address
-- The real byte address of each token's K and V vector for one layer and head, from the
-- recorded tensors: pointer + itemsize * sum(index[d] * stride[d]), each index from its
-- dimension's meaning (docs/engines.md, "Byte addresses"). The tokens are those the layer's
-- KV-cache group keeps, in that group's blocks and block size (pagedkv_layer_group,
-- engine_group_token). `in_bounds` is false where an index falls outside the tensor's
-- shape (then the address is not in it, and is computed in HUGEINT: such an address may
-- pass 2^63 without an overflow error).
-- Usage: SELECT * FROM pagedkv_kv_address(layer, head).
-- Plan: the tokens join their block list entry (hash join on seq_id, block_index); the
-- tensors holding K or V of the layer are a handful of rows, cross joined by pool.
CREATE OR REPLACE MACRO pagedkv_kv_address(layer, head) AS TABLE
WITH grp AS (
    SELECT pagedkv_layer_group(layer) AS g
), bs AS (
    SELECT coalesce((SELECT k.block_size FROM engine_kv_group k, grp WHERE k.group_id = grp.g),
                    (SELECT value FROM pagedkv_settings WHERE name = 'block_size')) AS b
),
tokens AS (
    SELECT vt.seq_id, vt.token_pos, bt.pool_id, bt.block_id, vt.offset_in_block AS slot
    FROM engine_group_token vt
    JOIN grp ON vt.group_id = grp.g
    JOIN engine_block_table bt
      ON bt.seq_id = vt.seq_id AND bt.group_id = grp.g AND bt.block_index = vt.block_index
    WHERE bt.block_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM engine_block z
                      WHERE z.is_null AND z.pool_id = bt.pool_id AND z.block_id = bt.block_id)
),
tensors AS (
    SELECT t.*, k.which
    FROM engine_cache_tensor t, (SELECT unnest([0, 1]) AS which) k
    WHERE (t.kv = k.which OR (t.kv IS NULL AND (list_contains(t.dims, 'kv')
                                                OR list_contains(t.dims, 'kvdim'))))
      AND CASE WHEN list_contains(t.dims, 'layer') THEN t.layer IS NULL OR t.layer = layer
               ELSE coalesce(t.layer, 0) = layer END
),
indexed AS (
    SELECT tok.seq_id, tok.token_pos, te.which, te.name, tok.block_id, tok.slot,
           te.pointer, te.itemsize, te.strides, te.shape,
           list_transform(range(1, len(te.dims) + 1), lambda i: CASE te.dims[i]
               WHEN 'block' THEN tok.block_id
               WHEN 'slot' THEN tok.slot
               WHEN 'token' THEN tok.block_id * bs.b + tok.slot
               WHEN 'head' THEN head
               WHEN 'dim' THEN 0
               WHEN 'kv' THEN te.which
               WHEN 'kvdim' THEN te.which * (te.shape[i] // 2)
               WHEN 'layer' THEN layer END) AS idx
    FROM tokens tok JOIN tensors te ON te.pool_id = tok.pool_id CROSS JOIN bs
)
SELECT seq_id, token_pos, CASE which WHEN 0 THEN 'K' ELSE 'V' END AS kv, name AS tensor,
       block_id, slot,
       pointer::HUGEINT + itemsize * list_sum(list_transform(range(1, len(idx) + 1),
                                   lambda i: idx[i]::HUGEINT * strides[i])) AS address,
       list_bool_and(list_transform(range(1, len(idx) + 1),
                                    lambda i: idx[i] >= 0 AND idx[i] < shape[i])) AS in_bounds
FROM indexed;

-- name: token_kv_address
-- The K and V addresses of one token: (layer, head, seq_id, token_pos).
SELECT CASE kv WHEN 'K' THEN 0 ELSE 1 END, tensor, block_id, slot, address, in_bounds
FROM pagedkv_kv_address(?, ?)
WHERE seq_id = ? AND token_pos = ?
ORDER BY ALL;
