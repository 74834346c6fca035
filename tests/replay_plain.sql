-- The plain plan of replay (the first one, kept as the reference): window passes by
-- request and by block, token counts by ASOF join, request ids as strings. Tests run it
-- beside sql/replay.sql on random logs and compare the findings row for row.
-- It reads replay_event with the event table's own columns (request VARCHAR) and replay_log.

-- name: build_replay_request
-- The requests, numbered 1, 2, ... in order of arrival: seq_id = block_table_ptr.
CREATE OR REPLACE TABLE replay_request AS
SELECT row_number() OVER (ORDER BY first_event) AS seq_id, request AS request_id,
       arrive_step, free_step, free_event
FROM (
    SELECT request, min(event) AS first_event, min(step) AS arrive_step,
           min(step) FILTER (WHERE op = 'free' AND block_index IS NULL AND block_id IS NULL
                                   AND cpu_address IS NULL) AS free_step,
           min(event) FILTER (WHERE op = 'free' AND block_index IS NULL AND block_id IS NULL
                                    AND cpu_address IS NULL) AS free_event
    FROM replay_event WHERE request IS NOT NULL GROUP BY request
);

-- name: build_replay_location
-- Every block-table entry's locations as intervals: from the event that put it on the GPU
-- (allocate, share, fork, swap_in) or on the CPU (swap_out, a fork of a swapped entry) to
-- the next event of the same entry (NULL: still there at the end of the log).
-- Plan: one window pass partitioned by (request, block_index).
CREATE OR REPLACE TABLE replay_location AS
WITH keyed AS (
    SELECT request, block_index, event, step, op, block_id, cpu_address,
           lead(event) OVER k AS to_event, lead(step) OVER k AS to_step, lead(op) OVER k AS end_op
    FROM replay_event
    WHERE block_index IS NOT NULL
    WINDOW k AS (PARTITION BY request, block_index ORDER BY event)
)
SELECT request, block_index,
       CASE WHEN op = 'swap_out' OR block_id IS NULL THEN 'cpu' ELSE 'gpu' END AS tier,
       CASE WHEN op = 'swap_out' OR block_id IS NULL THEN NULL ELSE block_id END AS block_id,
       CASE WHEN op = 'swap_out' OR block_id IS NULL THEN cpu_address END AS cpu_address,
       op AS kind, event AS from_event, step AS from_step, to_event, to_step, end_op
FROM keyed
WHERE op IN ('allocate', 'share', 'fork', 'swap_in', 'swap_out');

-- name: build_replay_tokens
-- Each request's token count after each event that sets it: an append (token_to), or a
-- free or preempt (its request-level row: 0). A count holds until the request's next row
-- here: ASOF joins and arg_max read it, so no window pass is needed.
CREATE OR REPLACE TABLE replay_tokens AS
SELECT request, event AS from_event, step AS from_step, coalesce(token_to, 0) AS tokens
FROM replay_event
WHERE (op = 'append' AND token_to IS NOT NULL)
   OR (op IN ('free', 'preempt') AND block_index IS NULL AND block_id IS NULL
       AND cpu_address IS NULL);

-- name: build_replay_holder_change
-- Every change of a GPU block's holders (+1 when an entry starts holding it, -1 when that
-- ends), with the running count after the change.
-- Plan: one window pass partitioned by block.
CREATE OR REPLACE TABLE replay_holder_change AS
WITH d AS (
    SELECT block_id, from_event AS event, from_step AS step, 1 AS delta, request, block_index,
           kind AS op
    FROM replay_location WHERE tier = 'gpu'
    UNION ALL
    SELECT block_id, to_event, to_step, -1, request, block_index, end_op
    FROM replay_location WHERE tier = 'gpu' AND to_event IS NOT NULL
)
SELECT *, sum(delta) OVER (PARTITION BY block_id ORDER BY event ROWS UNBOUNDED PRECEDING)
          AS holders
FROM d;

-- name: replay_check_fresh_while_held
-- A block allocated fresh (allocate, swap_in) while another entry holds it: two requests
-- now read and write one block (vLLM #37076). The message names first the last request
-- that let the block go (an entry's end other than kept) while the holders held it.
WITH bad AS (
    SELECT * FROM replay_holder_change
    WHERE delta = 1 AND op IN ('allocate', 'swap_in') AND holders > 1
), named AS (
    SELECT b.event, b.step, b.op, b.request, b.block_id, b.block_index, b.holders,
           string_agg(DISTINCT o.request, ',' ORDER BY o.request) AS others_csv,
           string_agg(DISTINCT o.request, ', ' ORDER BY o.request) AS others_text,
           list(o.request) AS others, min(o.from_event) AS held_from
    FROM bad b
    JOIN replay_location o
      ON o.tier = 'gpu' AND o.block_id = b.block_id AND o.from_event < b.event
     AND (o.to_event IS NULL OR o.to_event > b.event)
    GROUP BY b.event, b.step, b.op, b.request, b.block_id, b.block_index, b.holders
)
SELECT 'fresh_while_held' AS invariant, n.event, n.step, n.op, n.request, n.others_csv,
       n.block_id, n.block_index, 'no holder' AS expected,
       (n.holders - 1) || ' holder(s)' AS found,
       coalesce((SELECT 'request ' || e.request || '''s '
                        || CASE WHEN e.op = 'release' AND e.value IS NOT NULL THEN 'window_free'
                                ELSE e.op END
                        || ' at step ' || e.step || ' let go of block ' || n.block_id
                        || ' while others still held it, then '
                 FROM replay_holder_change c JOIN replay_event e ON e.event = c.event
                 WHERE c.block_id = n.block_id AND c.event < n.event AND c.event > n.held_from
                   AND c.delta = -1 AND c.op <> 'kept'
                   AND NOT list_contains(n.others, c.request)
                 ORDER BY c.event DESC LIMIT 1), '')
           || 'block ' || n.block_id || ' handed to request ' || n.request || ' (' || n.op
           || ') while request(s) ' || n.others_text || ' hold it' AS message
FROM named n

-- name: replay_check_double_free
-- A block released (release, swap_out, swap_in) by a request that does not hold it: freed
-- more often than acquired (vLLM #42571).
SELECT 'double_free', e.event, e.step, e.op, e.request, NULL,
       e.block_id, NULL, 'request holds block ' || e.block_id,
       coalesce(h.holders, 0) || ' holder(s), not this request',
       'request ' || e.request || ' ' || e.op || 's block ' || e.block_id
           || ' which it does not hold (' || coalesce(h.holders, 0) || ' holder(s))'
           || CASE WHEN e.op IN ('free', 'preempt')
                   THEN ': the block was given back twice, or was not its' ELSE '' END
FROM replay_event e
ASOF LEFT JOIN replay_holder_change h ON h.block_id = e.block_id AND h.event <= e.event
WHERE ((e.op IN ('release', 'swap_out', 'swap_in') AND e.block_index IS NULL)
       OR (e.op IN ('free', 'preempt') AND e.block_index IS NULL AND e.block_id IS NOT NULL))
  AND e.request NOT IN (SELECT request_id FROM replay_request
                        WHERE free_event IS NOT NULL AND free_event < e.event);

-- name: replay_check_refcount_mismatch
-- The engine's observed ref_cnt of a block differs from the holders replayed, named by the
-- request of the block's last holder change before it.
SELECT 'refcount_mismatch', o.event, o.step, o.op, h.request, NULL, o.block_id, NULL,
       coalesce(h.holders, 0) || ' holder(s) replayed', 'ref_cnt ' || o.value,
       'engine reports ref_cnt ' || o.value || ' for block ' || o.block_id || ', replay has '
           || coalesce(h.holders, 0) || ' holder(s)'
           || CASE WHEN h.request IS NOT NULL
                   THEN ' (last changed by request ' || h.request || '''s '
                        || CASE h.op WHEN 'kept' THEN 'free or preemption, which kept it back'
                                ELSE h.op END || ')'
                   ELSE '' END
FROM replay_event o
ASOF LEFT JOIN replay_holder_change h ON h.block_id = o.block_id AND h.event <= o.event
WHERE o.op = 'observe_ref' AND o.value <> coalesce(h.holders, 0);

-- name: replay_check_free_count
-- The engine's observed free-block count differs from the pool size minus the blocks held
-- (and the reserved ones). Only when the header gives num_gpu_blocks.
WITH used_change AS (
    SELECT event, CASE WHEN delta = 1 AND holders = 1 THEN 1
                       WHEN delta = -1 AND holders = 0 THEN -1 ELSE 0 END AS d
    FROM replay_holder_change
), used AS (
    SELECT event, sum(d) OVER (ORDER BY event ROWS UNBOUNDED PRECEDING) AS used
    FROM used_change WHERE d <> 0
), expected AS (
    SELECT o.event, o.step, o.op, o.value,
           l.num_gpu_blocks - len(l.reserved_blocks) - coalesce(u.used, 0) AS free
    FROM replay_event o
    CROSS JOIN replay_log l
    ASOF LEFT JOIN used u ON u.event <= o.event
    WHERE o.op = 'observe_free' AND l.num_gpu_blocks IS NOT NULL
)
SELECT 'free_count', event, step, op, NULL, NULL, NULL, NULL,
       free || ' free block(s) replayed', value || ' free',
       'engine reports ' || value || ' free block(s), replay has ' || free
FROM expected WHERE value <> free;

-- name: replay_check_stale_token
-- A token resolving to a block that changed hands since it was written: a block allocated
-- fresh or evicted while a holder has tokens in it, or a block acquired (allocate, share)
-- for a block index whose tokens were written before it.
WITH fresh AS (
    SELECT event, step, op, request, block_id FROM replay_holder_change
    WHERE delta = 1 AND op IN ('allocate', 'swap_in') AND holders > 1
    UNION ALL
    SELECT event, step, op, NULL, block_id FROM replay_event WHERE op = 'evict'
), victims AS (
    SELECT f.event, f.step, f.op, f.request AS taker, f.block_id, o.request, o.block_index
    FROM fresh f
    JOIN replay_location o
      ON o.tier = 'gpu' AND o.block_id = f.block_id AND o.from_event < f.event
     AND (o.to_event IS NULL OR o.to_event > f.event)
), victim_tokens AS (
    SELECT v.*, coalesce(t.tokens, 0) AS tokens FROM victims v
    ASOF LEFT JOIN replay_tokens t ON t.request = v.request AND t.from_event <= v.event
), late AS (
    SELECT e.event, e.step, e.op, e.request, e.block_id, e.block_index,
           coalesce(t.tokens, 0) AS tokens
    FROM replay_event e
    ASOF LEFT JOIN replay_tokens t ON t.request = e.request AND t.from_event <= e.event
    WHERE e.op IN ('allocate', 'share') AND e.block_index IS NOT NULL
)
SELECT 'stale_token', v.event, v.step, v.op, v.request, v.taker, v.block_id, v.block_index,
       'block keeps the tokens written to it', 'block ' || v.op || 'ed',
       'tokens ' || (v.block_index * l.block_size) || '..'
           || (least(v.tokens, (v.block_index + 1) * l.block_size) - 1) || ' of request '
           || v.request || ' were written to block ' || v.block_id || ', which is now '
           || CASE WHEN v.op = 'evict' THEN 'evicted'
                   ELSE 'handed to request ' || v.taker END
FROM victim_tokens v CROSS JOIN replay_log l
WHERE v.tokens > v.block_index * l.block_size
UNION ALL
SELECT 'stale_token', a.event, a.step, a.op, a.request, NULL, a.block_id, a.block_index,
       'tokens written after their block', a.tokens || ' token(s) written before',
       'request ' || a.request || ' had written tokens ' || (a.block_index * l.block_size)
           || '..' || (least(a.tokens, (a.block_index + 1) * l.block_size) - 1)
           || ' before block ' || a.block_id || ' became its block ' || a.block_index
FROM late a CROSS JOIN replay_log l
WHERE a.tokens > a.block_index * l.block_size;

-- name: replay_check_freed_request_referenced
-- An event naming a request (or a fork's parent) after that request was freed.
WITH freed AS (
    SELECT request, min(event) AS freed_event, min(step) AS freed_step FROM replay_event
    WHERE op = 'free' AND block_index IS NULL AND block_id IS NULL AND cpu_address IS NULL
    GROUP BY request
), refs AS (
    SELECT event, step, op, request AS named, request, block_id FROM replay_event
    UNION ALL
    SELECT event, step, op, parent, request, block_id FROM replay_event WHERE parent IS NOT NULL
)
SELECT 'freed_request_referenced', r.event, r.step, r.op, r.named, NULLIF(r.request, r.named),
       r.block_id, NULL, 'no event after step ' || f.freed_step, r.op,
       'request ' || r.named || ' was freed at step ' || f.freed_step || ' but ' || r.op
           || ' names it' AS message
FROM refs r JOIN freed f ON f.request = r.named AND r.event > f.freed_event;

-- name: replay_check_unresolved_token
-- A token with no block: written to a block index the request has no entry for (resident or
-- swapped) at the end of that step, or left behind when its block was released.
WITH appended AS (
    SELECT event, step, request, token_from, token_to,
           unnest(range(token_from // l.block_size, (token_to - 1) // l.block_size + 1))
               AS block_index
    FROM replay_event CROSS JOIN replay_log l
    WHERE op = 'append' AND token_to > token_from
), missing AS (
    SELECT a.* FROM appended a
    ANTI JOIN replay_location o
      ON o.request = a.request AND o.block_index = a.block_index
     AND o.from_step <= a.step AND (o.to_step IS NULL OR o.to_step > a.step)
), released AS (
    SELECT e.event, e.step, e.request, e.block_id, e.block_index, coalesce(t.tokens, 0) AS tokens
    FROM replay_event e
    ASOF LEFT JOIN replay_tokens t ON t.request = e.request AND t.from_event <= e.event
    WHERE e.op = 'release' AND e.block_index IS NOT NULL
)
SELECT 'unresolved_token', m.event, m.step, 'append', m.request, NULL, NULL, m.block_index,
       'block ' || m.block_index || ' resident or swapped', 'no block',
       'tokens ' || greatest(m.token_from, m.block_index * l.block_size) || '..'
           || (least(m.token_to, (m.block_index + 1) * l.block_size) - 1) || ' of request '
           || m.request || ' have no block ' || m.block_index
FROM missing m CROSS JOIN replay_log l
UNION ALL
SELECT 'unresolved_token', r.event, r.step, 'release', r.request, NULL, r.block_id,
       r.block_index, 'no tokens in a released block', r.tokens || ' token(s)',
       'request ' || r.request || ' released block ' || r.block_id || ' (its block '
           || r.block_index || ') with tokens ' || (r.block_index * l.block_size) || '..'
           || (least(r.tokens, (r.block_index + 1) * l.block_size) - 1) || ' in it'
FROM released r CROSS JOIN replay_log l
WHERE r.tokens > r.block_index * l.block_size;

-- name: replay_check_duplicate_block
-- One block twice in one request's block table (vLLM #42571: freed twice later).
WITH mine AS (
    SELECT *, sum(delta) OVER (PARTITION BY request, block_id ORDER BY event
                               ROWS UNBOUNDED PRECEDING) AS held_by_request
    FROM replay_holder_change
)
SELECT 'duplicate_block', event, step, op, request, NULL, block_id, block_index,
       'block once in the table', held_by_request || ' times',
       'block ' || block_id || ' is ' || held_by_request || ' times in the block table of '
           || 'request ' || request || ' (now also at block index ' || block_index || ')'
FROM mine WHERE delta = 1 AND held_by_request > 1;

-- name: replay_check_evict_held
-- A block evicted from the prefix cache while an entry holds it, naming its holders.
SELECT 'evict_held', e.event, e.step, e.op, NULL,
       (SELECT string_agg(DISTINCT o.request, ',' ORDER BY o.request) FROM replay_location o
        WHERE o.tier = 'gpu' AND o.block_id = e.block_id AND o.from_event < e.event
          AND (o.to_event IS NULL OR o.to_event > e.event)),
       e.block_id, NULL, 'no holder', h.holders || ' holder(s)',
       'block ' || e.block_id || ' evicted while request(s) '
           || (SELECT string_agg(DISTINCT o.request, ', ' ORDER BY o.request)
               FROM replay_location o
               WHERE o.tier = 'gpu' AND o.block_id = e.block_id AND o.from_event < e.event
                 AND (o.to_event IS NULL OR o.to_event > e.event)) || ' hold it'
FROM replay_event e
ASOF JOIN replay_holder_change h ON h.block_id = e.block_id AND h.event <= e.event
WHERE e.op = 'evict' AND h.holders > 0;

-- name: replay_check_outside_pool
-- A block id outside the pool (0 .. num_gpu_blocks-1), or a reserved block handed out.
SELECT 'outside_pool', e.event, e.step, e.op, e.request, NULL, e.block_id,
       e.block_index,
       'block id in 0..' || (l.num_gpu_blocks - 1) || ', not reserved',
       'block ' || e.block_id,
       CASE WHEN list_contains(l.reserved_blocks, e.block_id)
            THEN 'reserved block ' || e.block_id || ' handed to request ' || e.request
            ELSE 'block ' || e.block_id || ' is outside the pool of ' || l.num_gpu_blocks
                 || ' blocks' END
FROM replay_event e CROSS JOIN replay_log l
WHERE e.op IN ('allocate', 'share', 'fork', 'swap_in')
  AND (e.block_id >= l.num_gpu_blocks
       OR (e.op IN ('allocate', 'share', 'swap_in') AND list_contains(l.reserved_blocks, e.block_id)));

-- name: replay_check_unaligned_cpu_address
-- A block swapped out to a CPU address that is not 256-byte aligned (check's
-- diag_unaligned_cpu_address, at the step it happened).
SELECT 'unaligned_cpu_address', event, step, op, request, NULL, block_id, block_index,
       'cpu address a multiple of 256', 'cpu address ' || cpu_address,
       'block ' || block_id || ' of request ' || request || ' swapped out to cpu address '
           || cpu_address || ', not 256-byte aligned'
FROM replay_event WHERE op = 'swap_out' AND cpu_address % 256 <> 0;

-- name: replay_check_leak
-- A block whose entry ended kept (its request's free did not give it back) with no holder
-- left.
SELECT 'leak', e.event, e.step, e.op, e.request, NULL, e.block_id, e.block_index,
       'block given back to the pool', 'kept back, no holder',
       'request ' || e.request || ' let go of block ' || e.block_id || ' (its block index '
           || e.block_index || ') without giving it back to the pool, and no entry holds it: '
           || 'it never returns to the free list'
FROM replay_event e
ASOF LEFT JOIN replay_holder_change h ON h.block_id = e.block_id AND h.event <= e.event
WHERE e.op = 'kept' AND e.block_index IS NOT NULL AND coalesce(h.holders, 0) = 0;

-- name: replay_check_held_free_block
-- A block observed in the engine's free list while entries hold it, named by its holders.
WITH listed AS (
    SELECT e.event, e.step, e.op, e.block_id, h.holders
    FROM replay_event e
    ASOF LEFT JOIN replay_holder_change h ON h.block_id = e.block_id AND h.event <= e.event
    WHERE e.op = 'observe_free_list' AND coalesce(h.holders, 0) > 0
), holders AS (
    SELECT l.*, o.request, o.block_index,
           dense_rank() OVER (PARTITION BY l.event ORDER BY o.request) AS nth
    FROM listed l
    JOIN replay_location o
      ON o.tier = 'gpu' AND o.block_id = l.block_id AND o.from_event < l.event
     AND (o.to_event IS NULL OR o.to_event > l.event)
)
SELECT 'held_free_block', event, step, op,
       min(request) FILTER (WHERE nth = 1),
       NULLIF(string_agg(DISTINCT request, ',' ORDER BY request) FILTER (WHERE nth > 1), ''),
       block_id, min(block_index) FILTER (WHERE nth = 1),
       'held blocks out of the free list', 'in the free list, ' || holders || ' holder(s)',
       'block ' || block_id || ' is in the engine''s free list while request(s) '
           || string_agg(DISTINCT request, ', ' ORDER BY request) || ' hold it'
FROM holders
GROUP BY event, step, op, block_id, holders;

-- name: replay_check_free_list_duplicate
-- A block observed more than once in the engine's free list, named by the request of the
-- block's last holder change before it.
SELECT 'free_list_duplicate', o.event, o.step, o.op, h.request, NULL, o.block_id, NULL,
       'block once in the free list', o.value || ' times in the free list',
       'block ' || o.block_id || ' is ' || o.value || ' times in the engine''s free list '
           || '(given back again with no allocation between)'
           || CASE WHEN h.request IS NOT NULL
                   THEN ' (last released by request ' || h.request || '''s '
                        || CASE h.op WHEN 'kept' THEN 'free or preemption, which kept it back'
                                ELSE h.op END || ')'
                   ELSE '' END
FROM replay_event o
ASOF LEFT JOIN replay_holder_change h ON h.block_id = o.block_id AND h.event < o.event
WHERE o.op = 'observe_free_list' AND o.value > 1;

-- name: replay_check_prefix_hash
-- A share asking a hash that is not its block's cached hash (the last cache of the block,
-- unless an evict came after it), or a cache of a block under another hash than a sharer
-- holding it asked for.
WITH last_hash AS (
    SELECT s.event, s.step, s.request, s.block_id, s.block_index, s.value AS asked,
           h.op AS hash_op, h.value AS cached,
           row_number() OVER (PARTITION BY s.event ORDER BY h.event DESC) AS latest
    FROM replay_event s
    JOIN replay_event h
      ON h.block_id = s.block_id AND h.event < s.event AND h.op IN ('cache', 'evict')
    WHERE s.op = 'share' AND s.value IS NOT NULL AND s.block_index IS NOT NULL
), found AS (
    SELECT event, step, 'share' AS op, request, block_id, block_index, asked, cached
    FROM last_hash WHERE latest = 1 AND hash_op = 'cache' AND cached <> asked
    UNION ALL
    SELECT c.event, c.step, 'cache', o.request, c.block_id, o.block_index, s.value, c.value
    FROM replay_event c
    JOIN replay_location o
      ON o.kind = 'share' AND o.block_id = c.block_id AND o.from_event < c.event
     AND (o.to_event IS NULL OR o.to_event > c.event)
    JOIN replay_event s ON s.event = o.from_event
    WHERE c.op = 'cache' AND s.value IS NOT NULL AND s.value <> c.value
)
SELECT 'prefix_hash', event, step, op, request, NULL, block_id, block_index,
       'hash ' || lpad(lower(hex(asked)), 16, '0'), 'hash ' || lpad(lower(hex(cached)), 16, '0'),
       CASE op
           WHEN 'share' THEN 'request ' || request || ' shares block ' || block_id
               || ' as its block ' || block_index || ' for hash '
               || lpad(lower(hex(asked)), 16, '0') || ', but the block is cached under '
               || lpad(lower(hex(cached)), 16, '0') || ': a prefix hit on another''s KV'
           ELSE 'block ' || block_id || ' is cached under hash '
               || lpad(lower(hex(cached)), 16, '0') || ' while request ' || request
               || ' holds it as its block ' || block_index || ' for hash '
               || lpad(lower(hex(asked)), 16, '0') || ': a prefix hit on another''s KV' END
FROM found;
