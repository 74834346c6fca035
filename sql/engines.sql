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
-- swapped_block rows. base + block_id * block_step is a block's address in the spec's
-- relations: pointer and block_bytes when both are known and 256-aligned, else see
-- docs/engines.md.
CREATE TABLE IF NOT EXISTS engine_pool (
    pool_id     BIGINT NOT NULL,
    name        VARCHAR NOT NULL,
    tier        VARCHAR NOT NULL CHECK (tier IN ('gpu', 'cpu')),
    pointer     BIGINT,
    block_bytes BIGINT,
    num_blocks  BIGINT,
    base        BIGINT NOT NULL,
    block_step  BIGINT NOT NULL
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
-- Group 0's resident blocks: base = pool base + block_id * block_step; refcount = the
-- engine's ref_cnt where it keeps one, else the number of block-table slots holding the
-- block. Holes and the null block give no row (their tokens are page faults).
-- Plan: one window count per (pool, block) over group 0's list, one hash join each with
-- the pools and the block bookkeeping; no per-token work.
WITH listed AS (
    SELECT bt.seq_id, bt.block_index, bt.pool_id, bt.block_id,
           count(*) OVER (PARTITION BY bt.pool_id, bt.block_id) AS holders
    FROM engine_block_table bt
    WHERE bt.group_id = 0 AND bt.block_id IS NOT NULL
)
SELECT l.seq_id AS block_table_id, l.block_index,
       p.base + l.block_id * p.block_step AS physical_block_base,
       coalesce(b.ref_cnt, l.holders) AS refcount
FROM listed l
JOIN engine_pool p ON p.pool_id = l.pool_id AND p.tier = 'gpu'
LEFT JOIN engine_block b ON b.pool_id = l.pool_id AND b.block_id = l.block_id
WHERE NOT coalesce(b.is_null, false);

-- name: engine_to_swapped_block
-- Group 0's blocks in a CPU pool: cpu_base_address = pool base + block_id * block_step.
SELECT bt.seq_id AS block_table_id, bt.block_index,
       p.base + bt.block_id * p.block_step AS cpu_base_address
FROM engine_block_table bt
JOIN engine_pool p ON p.pool_id = bt.pool_id AND p.tier = 'cpu'
WHERE bt.group_id = 0 AND bt.block_id IS NOT NULL;

-- name: engine_to_virtual_token
-- Tokens 0 .. num_tokens-1 of each request: block_index = pos // B, offset = pos % B,
-- except where the engine records a flat slot per token: there offset = slot % B, so a
-- slot in the wrong place of its page shows as a wrong decomposition. Parameter: B.
-- Plan: range() per request generates the tokens without reading any; the slots table
-- (empty for block-list engines) replaces the requests it covers.
WITH bs AS (SELECT ?::BIGINT AS b),
slotted AS (SELECT DISTINCT seq_id FROM engine_token_slot)
SELECT r.seq_id, t.pos AS token_pos, t.pos // bs.b AS block_index,
       t.pos % bs.b AS offset_in_block
FROM engine_request r, bs, LATERAL range(r.num_tokens) t(pos)
WHERE r.seq_id NOT IN (SELECT seq_id FROM slotted)
UNION ALL
SELECT s.seq_id, s.token_pos, s.token_pos // bs.b, s.slot % bs.b
FROM engine_token_slot s, bs;

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
