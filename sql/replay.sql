-- Replay of a step log (docs/replay.md), relationally and in bulk.
-- replay_event holds the log, one row a block-level event, its request as an integer key
-- (replay_request numbers the requests once, at load, and maps keys to ids). From it, once per
-- log: replay_location (every block-table entry's locations as intervals
-- [from_event, to_event), with their steps; one sort of the block-level events),
-- replay_holder_change (every change of a GPU block's holders and every event that asks for
-- them, with the running count: one sort by block, shared by five invariants) and
-- replay_written (when each block index of each request got its first token: appends are
-- contiguous, so this is an expansion of the few appends that cross a block boundary, no
-- sort of the appends). Each invariant is one query over the whole log; the state at a step
-- is a filter over the intervals. Not part of the core schema: the replay module creates
-- these when it loads a log. tests/replay_plain.sql is the first, plain plan of the same
-- invariants, kept to compare against on random logs.

-- name: replay_op_outdated
-- Whether the database holds replay_op without every operation of this version (stored
-- by an older pagedkv-sql): it is then dropped (drop_replay_op) before the log is stored.
-- Plan: a catalog lookup.
SELECT count(*) FROM duckdb_types()
WHERE type_name = 'replay_op' AND NOT list_contains(labels, 'hit');

-- name: drop_replay_op
-- The outdated replay_op and the tables of the stored log built on it (made again by the
-- load that follows).
DROP TABLE IF EXISTS replay_holder_change;
DROP TABLE IF EXISTS replay_location;
DROP TABLE IF EXISTS replay_event;
DROP TABLE IF EXISTS replay_request;
DROP TYPE replay_op;

-- name: create_replay_event
-- The step log as block-level events (columns: docs/replay.md, the event table), the
-- request named by its key (rkey: replay_request maps it to the request id and seq_id), the
-- operation an ENUM (filters on it are integer compares; an unknown operation is NULL here
-- and named by replay_event_problems, which reads the source). value: observe_ref's ref_cnt,
-- observe_free's count, observe_free_list's entries in the free list, and a block hash
-- (64 bits, signed): the one a cache op caches the block under, the one a share asked for.
-- group_id: the KV-cache group whose table the event is of (a request has one key per
-- group). (A type stored by an older pagedkv-sql, without every operation of this version,
-- is dropped first: replay_op_outdated.)
CREATE TYPE IF NOT EXISTS replay_op AS ENUM (
    'arrive', 'allocate', 'share', 'fork', 'swap_in', 'append', 'swap_out', 'release', 'free',
    'preempt', 'evict', 'observe_ref', 'observe_free', 'cache', 'kept', 'observe_free_list',
    'hit'
);
CREATE OR REPLACE TABLE replay_event (
    event       BIGINT NOT NULL,
    step        BIGINT NOT NULL,
    op          replay_op,
    rkey         BIGINT,
    block_index BIGINT,
    block_id    BIGINT,
    cpu_address BIGINT,
    token_from  BIGINT,
    token_to    BIGINT,
    value       BIGINT,
    parent      VARCHAR,
    group_id    BIGINT NOT NULL
);

-- name: create_replay_log
-- The log's header: one row.
CREATE OR REPLACE TABLE replay_log (
    engine          VARCHAR NOT NULL,
    block_size      BIGINT NOT NULL,
    block_bytes     BIGINT NOT NULL,
    gpu_base        BIGINT NOT NULL,
    num_gpu_blocks  BIGINT,
    reserved_blocks BIGINT[] NOT NULL,
    steps           BIGINT,
    events          BIGINT,
    first_step      BIGINT,
    last_step       BIGINT,
    mark            VARCHAR, -- a recorder's mark where reading stopped (JSON), or NULL
    groups          VARCHAR  -- the header's KV-cache groups (JSON), or NULL: full attention
);

-- name: replay_event_problem_macro
-- What is wrong with one row of an event table read from Parquet / Arrow (NULL: nothing).
CREATE OR REPLACE MACRO replay_event_problem(op, step, has_request, block_index, block_id,
                                            token_from, token_to, value) AS CASE
    WHEN op NOT IN ('arrive', 'allocate', 'share', 'fork', 'swap_in', 'append', 'swap_out',
                    'release', 'free', 'preempt', 'evict', 'observe_ref', 'observe_free',
                    'cache', 'kept', 'observe_free_list', 'hit')
        THEN 'unknown operation ''' || op || ''''
    WHEN step < 0 THEN 'step ' || step || ' is negative'
    WHEN op IN ('evict', 'observe_ref', 'observe_free', 'cache', 'observe_free_list')
         AND has_request
        THEN op || ' names no request'
    WHEN op NOT IN ('evict', 'observe_ref', 'observe_free', 'cache', 'observe_free_list')
         AND NOT has_request
        THEN op || ' needs a request'
    WHEN op IN ('allocate', 'share', 'swap_in', 'swap_out', 'release', 'evict', 'observe_ref',
                'cache', 'kept', 'observe_free_list')
         AND block_id IS NULL THEN op || ' needs a block_id'
    WHEN op IN ('observe_ref', 'observe_free', 'cache', 'observe_free_list') AND value IS NULL
        THEN op || ' needs a value'
    WHEN op IN ('append', 'hit') AND (token_from IS NULL) <> (token_to IS NULL)
        THEN op || ' needs both token_from and token_to'
    WHEN op IN ('append', 'hit') AND (token_from < 0 OR token_to < token_from)
        THEN op || ' of tokens [' || token_from || ', ' || token_to || ') is not a range'
    WHEN block_index < 0 THEN 'block_index ' || block_index || ' is negative'
    WHEN block_id < 0 THEN 'block_id ' || block_id || ' is negative'
    END;

-- name: replay_event_quick_check
-- Is the stored event table well formed, and each request's facts: per request key (and
-- one row for the events that name no request), the rows with a problem
-- (replay_event_problem's conditions, on the ENUM: an unknown operation is NULL), the rows
-- out of order (compared with the row before, in the order the table was read), the step
-- changes, events and first and last step (summed into replay_log: --at and diff check
-- their step against them without a pass over the log), and the request's bounds (last
-- event, arrival, its free, first operation, last append), written into replay_request.
-- Plan: one streaming pass (lag() OVER () keeps the reading order, no sort) into a hash
-- aggregate by the integer key; the source is read once for the ids only
-- (build_replay_request). Only when a count is not 0 does replay_event_problems name the
-- rows (and it accepts a table whose rows are valid but not in event order).
CREATE OR REPLACE TEMP TABLE _replay_key_facts AS
SELECT rkey,
       count(*) FILTER (WHERE op IS NULL OR step < 0
                          OR (op IN ('evict', 'observe_ref', 'observe_free', 'cache',
                                     'observe_free_list')) = (rkey IS NOT NULL)
                          OR (block_id IS NULL AND op IN ('allocate', 'share', 'swap_in',
                                                          'swap_out', 'release', 'evict',
                                                          'observe_ref', 'cache', 'kept',
                                                          'observe_free_list'))
                          OR (value IS NULL AND op IN ('observe_ref', 'observe_free', 'cache',
                                                       'observe_free_list'))
                          OR (op = 'append' AND ((token_from IS NULL) <> (token_to IS NULL)
                                                 OR token_from < 0 OR token_to < token_from))
                          OR block_index < 0 OR block_id < 0) AS bad_rows,
       count(*) FILTER (WHERE event <= prev_event OR step < prev_step) AS unordered,
       count(*) FILTER (WHERE step IS DISTINCT FROM prev_step) AS steps,
       count(*) AS events, min(step) AS first_step, max(step) AS last_step,
       max(event) AS last_event,
       min(step) FILTER (WHERE op = 'free' AND block_index IS NULL AND block_id IS NULL
                               AND cpu_address IS NULL) AS free_step,
       min(event) FILTER (WHERE op = 'free' AND block_index IS NULL AND block_id IS NULL
                                AND cpu_address IS NULL) AS free_event,
       arg_min(op, event) AS first_op,
       max(step) FILTER (WHERE op = 'append') AS last_append_step
FROM (
    SELECT *, lag(event) OVER () AS prev_event, lag(step) OVER () AS prev_step
    FROM replay_event
)
GROUP BY rkey;

-- name: replay_request_facts
-- replay_request's bounds from the per-key facts of replay_event_quick_check.
UPDATE replay_request q
SET last_event = f.last_event, arrive_step = f.first_step, free_step = f.free_step,
    free_event = f.free_event, first_op = f.first_op, last_append_step = f.last_append_step
FROM _replay_key_facts f
WHERE f.rkey = q.rkey;

-- name: replay_event_quick_counts
-- The log's counts from the per-key facts (unborn: requests whose first event is not an
-- arrive; an unknown operation is counted as a bad row).
SELECT coalesce(sum(bad_rows), 0), coalesce(sum(unordered), 0),
       (SELECT count(*) FROM replay_request WHERE first_op IS DISTINCT FROM 'arrive'),
       coalesce(sum(steps), 0), coalesce(sum(events), 0), min(first_step), max(last_step)
FROM _replay_key_facts;

-- name: replay_event_problems
-- Rows of an event table read from Parquet / Arrow (_replay_source) that break its format.
-- Plan: row checks in one scan; order checked per step (each step's events must come after
-- the previous step's), so only the distinct steps are sorted, not every event; event
-- numbers are counted distinct only in steps whose numbers are not contiguous.
WITH rows AS (
    SELECT event, step, replay_event_problem(op, step, request IS NOT NULL, block_index,
                                             block_id, token_from, token_to, value) AS problem
    FROM _replay_source
), steps AS (
    SELECT step, min(event) AS first_event, max(event) AS last_event, count(*) AS n
    FROM _replay_source GROUP BY step
), gapped AS (
    SELECT step, count(DISTINCT event) AS distinct_events, count(*) AS n FROM _replay_source
    WHERE step IN (SELECT step FROM steps WHERE last_event - first_event + 1 <> n)
    GROUP BY step
), ordered AS (
    SELECT *, lag(last_event) OVER (ORDER BY step) AS prev_last,
           lag(step) OVER (ORDER BY step) AS prev_step
    FROM steps
)
SELECT event, step, problem FROM (
    SELECT * FROM rows WHERE problem IS NOT NULL
    UNION ALL
    SELECT first_event, step, 'step ' || step || ' is out of order (its events from '
           || first_event || ' come before event ' || prev_last || ' of step ' || prev_step
           || ')'
    FROM ordered WHERE first_event <= prev_last
    UNION ALL
    SELECT s.first_event, g.step, 'step ' || g.step || ' uses an event number twice'
    FROM gapped g JOIN steps s USING (step) WHERE g.distinct_events < g.n
    UNION ALL
    SELECT first_event, NULL, 'request ' || request || ' never existed: its first event is '
           || first_op || ', not arrive'
    FROM (SELECT request, min(event) AS first_event, arg_min(op, event) AS first_op
          FROM _replay_source WHERE request IS NOT NULL GROUP BY request)
    WHERE first_op <> 'arrive'
)
ORDER BY event, problem
LIMIT 1000;

-- name: replay_key_macros
-- A request's key in replay_event for its table in a KV-cache group (a 63-bit hash; group
-- 0's is the hash of the id alone, as in a log without groups), and the first token
-- position a group keeps of a request with n tokens: pagedkv_kept_start
-- (sql/kv_groups.sql) of the kind replay_request's window columns name (a sliding window
-- of sw tokens, a chunked local attention of chunk tokens; no window: full attention,
-- every token).
CREATE OR REPLACE MACRO replay_key(request, grp) AS
    ((CASE WHEN grp = 0 THEN hash(request) ELSE hash(request, grp) END) >> 1)::BIGINT;
CREATE OR REPLACE MACRO replay_kept_from(n, sw, chunk) AS
    pagedkv_kept_start(CASE WHEN sw IS NOT NULL THEN 'sliding_window'
                            WHEN chunk IS NOT NULL THEN 'chunked_local_attention' END,
                       coalesce(sw, chunk), n);

-- name: build_replay_request
-- The requests of the log read from _replay_source, one row per request and KV-cache group
-- (a table of its own), the requests numbered 1, 2, ... in order of arrival (seq_id =
-- block_table_ptr), each row with its key in replay_event (rkey: a 63-bit hash of the id
-- and the group, computed row by row, so that storing the log needs no join and keeps its
-- order; a collision is detected at load and the key is then key_no, by a join) and its
-- first event. The group's constants (block size, window, whether it is the primary group,
-- the one the spec's relations describe) are set by the loader from the header; the events
-- that bound each row (last event, arrival, free, first op, last append) are filled in from
-- the stored events by replay_request_facts.
-- Plan: one hash aggregate by (request id, group) over the source, reading three of its
-- columns.
CREATE OR REPLACE TABLE replay_request AS
SELECT dense_rank() OVER (ORDER BY request_first, request) AS seq_id, request AS request_id,
       NULL::BIGINT AS arrive_step, NULL::BIGINT AS free_step,
       replay_key(request, group_id) AS rkey, first_event, NULL::BIGINT AS last_event,
       NULL::BIGINT AS free_event, NULL::replay_op AS first_op,
       NULL::BIGINT AS last_append_step, group_id, TRUE AS is_primary,
       NULL::BIGINT AS block_size, NULL::BIGINT AS sliding_window,
       NULL::BIGINT AS attention_chunk_size,
       row_number() OVER (ORDER BY first_event, group_id) AS key_no
FROM (
    SELECT request, group_id, min(event) AS first_event,
           min(min(event)) OVER (PARTITION BY request) AS request_first
    FROM _replay_source WHERE request IS NOT NULL GROUP BY request, group_id
);

-- name: insert_replay_event
-- The events of _replay_source, each request id replaced by its key.
-- Plan: one streaming pass in the source's order (no join, no sort).
INSERT INTO replay_event
SELECT event, step, try_cast(op AS replay_op),
       CASE WHEN request IS NOT NULL THEN replay_key(request, group_id) END,
       block_index, block_id, cpu_address,
       token_from, token_to, value, parent, group_id
FROM _replay_source;

-- name: insert_replay_event_joined
-- The same, when two request ids hash alike: the key is seq_id, found by a hash join (which
-- does not keep the source's order).
INSERT INTO replay_event
SELECT s.event, s.step, try_cast(s.op AS replay_op), r.rkey, s.block_index, s.block_id,
       s.cpu_address,
       s.token_from, s.token_to, s.value, s.parent, s.group_id
FROM _replay_source s
LEFT JOIN replay_request r ON r.request_id = s.request AND r.group_id = s.group_id;

-- name: replay_event_table
-- The stored log as the event table (docs/replay.md), request ids restored, in order.
SELECT e.event, e.step, e.op::VARCHAR AS op, r.request_id AS request, e.block_index, e.block_id,
       e.cpu_address, e.token_from, e.token_to, e.value, e.parent, e.group_id
FROM replay_event e LEFT JOIN replay_request r ON r.rkey = e.rkey
ORDER BY e.event;

-- name: build_replay_location
-- Every block-table entry's locations as intervals: from the event that put it on the GPU
-- (allocate, share, fork, swap_in) or on the CPU (swap_out, a fork of a swapped entry) to
-- the next event of the same entry (NULL: still there at the end of the log).
-- Plan: one sort of the block-level events by (rkey, block_index, event DESC), then a
-- streaming lag() (one ordered pass, no partitioned window): the row before in that order
-- is the entry's next event when it has the same key. A partitioned lead() window cost
-- 1.5-2.0 CPU s at 100k steps against 0.8-1.1 for the sort and the pass (docs/performance.md).
CREATE OR REPLACE TABLE replay_location AS
WITH keyed AS (
    SELECT *, lag(rkey) OVER () AS next_rkey, lag(block_index) OVER () AS next_index,
           lag(event) OVER () AS next_event, lag(step) OVER () AS next_step,
           lag(op) OVER () AS next_op
    FROM (SELECT rkey, block_index, event, step, op, block_id, cpu_address FROM replay_event
          WHERE block_index IS NOT NULL
          ORDER BY rkey, block_index, event DESC)
), ended AS (
    SELECT *, next_rkey IS NOT DISTINCT FROM rkey AND next_index = block_index AS same
    FROM keyed
)
SELECT rkey, block_index,
       CASE WHEN op = 'swap_out' OR block_id IS NULL THEN 'cpu' ELSE 'gpu' END AS tier,
       CASE WHEN op = 'swap_out' OR block_id IS NULL THEN NULL ELSE block_id END AS block_id,
       CASE WHEN op = 'swap_out' OR block_id IS NULL THEN cpu_address END AS cpu_address,
       op AS kind, event AS from_event, step AS from_step,
       CASE WHEN same THEN next_event END AS to_event,
       CASE WHEN same THEN next_step END AS to_step,
       CASE WHEN same THEN next_op END AS end_op
FROM ended
WHERE op IN ('allocate', 'share', 'fork', 'swap_in', 'swap_out');

-- name: build_replay_written
-- When each block index of each request got its first token: the append that wrote token
-- position block_index * block_size (an append writes [token_from, token_to) and appends
-- are contiguous, docs/replay.md), with the free or preempt that ends that life of the
-- request (NULL: none). "Request r has tokens in block index i at event e" is then "a row
-- (r, i) before e whose life has not ended by e": no token counts are carried per event.
-- Plan: only the appends that cross a block boundary (one in block_size, the block size of
-- the row's group: a hash join with replay_request) are kept; the
-- lives come from one left hash join against the few request-level resets (the lives of a
-- request tile its events, so each row meets one life, or none when it was never reset).
CREATE OR REPLACE TABLE replay_written AS
WITH starts AS MATERIALIZED (
    SELECT rkey, event, step, (token_from + bs - 1) // bs AS first_index,
           (token_to + bs - 1) // bs AS end_index
    FROM (SELECT rkey, event, step, token_from, token_to FROM replay_event
          WHERE op = 'append' AND token_to > token_from)
    JOIN (SELECT rkey, block_size AS bs FROM replay_request) USING (rkey)
    WHERE (token_to + bs - 1) // bs > (token_from + bs - 1) // bs
), w AS (
    SELECT rkey, first_index AS block_index, event, step FROM starts
    WHERE end_index = first_index + 1
    UNION ALL
    SELECT rkey, unnest(range(first_index, end_index)), event, step FROM starts
    WHERE end_index > first_index + 1
), resets AS MATERIALIZED (
    SELECT rkey, event, step, lag(event) OVER (PARTITION BY rkey ORDER BY event) AS prev
    FROM replay_event
    WHERE op IN ('free', 'preempt') AND block_index IS NULL AND block_id IS NULL
      AND cpu_address IS NULL AND rkey IS NOT NULL
), lives AS (
    SELECT rkey, prev AS life_from, event AS end_event, step AS end_step FROM resets
    UNION ALL
    SELECT rkey, max(event), NULL, NULL FROM resets GROUP BY rkey
)
SELECT w.rkey, w.block_index, w.event, w.step, v.end_event, v.end_step
FROM w LEFT JOIN lives v
  ON v.rkey = w.rkey AND (v.life_from IS NULL OR w.event > v.life_from)
 AND (v.end_event IS NULL OR w.event < v.end_event);

-- name: build_replay_holder_change
-- Every change of a GPU block's holders (delta +1 when an entry starts holding it, -1 when
-- that ends) and every event that asks how many hold it (delta 0: observe_ref,
-- observe_free_list, evict, and a release / swap / free / preempt that names a block its
-- request does not hold), with the running count
-- after the row (for a delta 0 row: the holders at that event).
-- Plan: one sort by (block_id, event, delta) and a streaming running sum over all blocks:
-- an entry still holding its block at the end of the log gets a closing -1 row after the
-- block's last event (event NULL, sorted last, dropped), so each block's changes sum to 0
-- and the running sum starts each block at 0. The invariants that compare with the holders
-- (fresh_while_held, double_free, refcount_mismatch, evict_held, free_count) read
-- this table instead of joining their events against the intervals (no ASOF join). A window
-- partitioned by block cost 1.6-2.2 CPU s at 100k steps (docs/performance.md).
CREATE OR REPLACE TABLE replay_holder_change AS
WITH d AS (
    SELECT block_id, from_event AS event, from_step AS step, 1 AS delta, rkey, block_index,
           kind AS op, NULL::BIGINT AS value
    FROM replay_location WHERE tier = 'gpu'
    UNION ALL
    SELECT block_id, to_event, to_step, -1, rkey, block_index, end_op, NULL
    FROM replay_location WHERE tier = 'gpu'
    UNION ALL
    SELECT block_id, event, step, 0, rkey, NULL, op, value FROM replay_event
    WHERE op IN ('observe_ref', 'evict', 'observe_free_list')
       OR (op IN ('release', 'swap_out', 'swap_in') AND block_index IS NULL)
       OR (op IN ('free', 'preempt') AND block_index IS NULL AND block_id IS NOT NULL)
)
SELECT * FROM (
    SELECT *, sum(delta) OVER (ROWS UNBOUNDED PRECEDING) AS holders
    FROM (SELECT * FROM d ORDER BY block_id, event NULLS LAST, delta)
)
WHERE event IS NOT NULL;

-- name: replay_check_fresh_while_held
-- A block allocated fresh (allocate, swap_in) while another entry holds it: two requests
-- now read and write one block (vLLM #37076). When another request let the block go while
-- those held it (its free, release, window free, preemption or swap out, the last before
-- the allocation), the message names that request and op first: where the engine most
-- likely gave the block back to its pool (the culprit), the holders after (the victims).
-- Plan: the bad rows are few; each block's earlier holder changes are read for them only.
WITH bad AS MATERIALIZED (
    SELECT * FROM replay_holder_change
    WHERE delta = 1 AND op IN ('allocate', 'swap_in') AND holders > 1
), named AS (
    SELECT b.event, b.step, b.op, q.request_id AS request, o_q.request_id AS other,
           b.block_id, b.block_index, b.holders, o.rkey AS other_key,
           o.from_event AS other_from
    FROM bad b
    JOIN replay_location o
      ON o.tier = 'gpu' AND o.block_id = b.block_id AND o.from_event < b.event
     AND (o.to_event IS NULL OR o.to_event > b.event)
    JOIN replay_request q ON q.rkey = b.rkey
    JOIN replay_request o_q ON o_q.rkey = o.rkey
), let_go AS (  -- the last let-go by a request that is not a holder, while one held it
    SELECT b.event, b.block_id, max(c.event) AS c_event
    FROM (SELECT event, block_id, min(other_from) AS held_from, list(other_key) AS keys
          FROM named GROUP BY event, block_id) b
    JOIN replay_holder_change c
      ON c.block_id = b.block_id AND c.event < b.event AND c.event > b.held_from
     AND c.rkey IS NOT NULL AND NOT list_contains(b.keys, c.rkey)
     AND (c.delta = -1 AND c.op <> 'kept'
          OR c.delta = 0 AND c.op IN ('release', 'free', 'preempt', 'swap_out'))
    GROUP BY b.event, b.block_id
), culprit AS (
    SELECT l.event, l.block_id,
           'request ' || q.request_id || '''s '
               || CASE WHEN e.op = 'release' AND e.value IS NOT NULL THEN 'window_free'
                       ELSE e.op::VARCHAR END
               || ' at step ' || e.step || ' let go of block ' || l.block_id
               || ' while others still held it, then ' AS said
    FROM let_go l
    JOIN replay_event e ON e.event = l.c_event
    JOIN replay_request q ON q.rkey = e.rkey
)
SELECT 'fresh_while_held' AS invariant, n.event, n.step, n.op, n.request,
       string_agg(DISTINCT n.other, ',' ORDER BY n.other) AS other_requests,
       n.block_id, n.block_index, 'no holder' AS expected,
       (n.holders - 1) || ' holder(s)' AS found,
       coalesce(any_value(c.said), '') || 'block ' || n.block_id || ' handed to request '
           || n.request || ' (' || n.op || ') while request(s) '
           || string_agg(DISTINCT n.other, ', ' ORDER BY n.other) || ' hold it' AS message
FROM named n
LEFT JOIN culprit c ON c.event = n.event AND c.block_id = n.block_id
GROUP BY n.event, n.step, n.op, n.request, n.block_id, n.block_index, n.holders

-- name: replay_check_double_free
-- A block released (release, swap_out, swap_in) by a request that does not hold it, or
-- given back by a request's free or preemption (its handed blocks) more often than the
-- request held it: freed more often than acquired (vLLM #42571). Before the request's free
-- event, not its step: a release earlier in the step that frees the request is a double
-- free too (after the free, freed_request_referenced names it).
SELECT 'double_free', h.event, h.step, h.op, q.request_id, NULL,
       h.block_id, NULL, 'request holds block ' || h.block_id,
       h.holders || ' holder(s), not this request',
       'request ' || q.request_id || ' ' || h.op || 's block ' || h.block_id
           || ' which it does not hold (' || h.holders || ' holder(s))'
           || CASE WHEN h.op IN ('free', 'preempt')
                   THEN ': the block was given back twice, or was not its' ELSE '' END
FROM replay_holder_change h
JOIN replay_request q ON q.rkey = h.rkey
WHERE h.delta = 0 AND h.op IN ('release', 'swap_out', 'swap_in', 'free', 'preempt')
  AND (q.free_event IS NULL OR q.free_event > h.event);

-- name: replay_check_refcount_mismatch
-- The engine's observed ref_cnt of a block differs from the holders replayed, named by the
-- request whose event last changed the block's holders before it (the free whose decrement
-- the engine skipped or made twice); NULL when no event changed them.
-- Plan: the mismatches are few: each meets the last change of its block before it by one
-- ASOF join against the changes of those blocks only (replay_holder_change, delta <> 0).
WITH bad AS MATERIALIZED (
    SELECT event, step, op, block_id, holders, value FROM replay_holder_change
    WHERE delta = 0 AND op = 'observe_ref' AND value <> holders
), changes AS (
    SELECT block_id, event, rkey, op FROM replay_holder_change
    WHERE delta <> 0 AND block_id IN (SELECT block_id FROM bad)
)
SELECT 'refcount_mismatch', b.event, b.step, b.op, q.request_id, NULL, b.block_id, NULL,
       b.holders || ' holder(s) replayed', 'ref_cnt ' || b.value,
       'engine reports ref_cnt ' || b.value || ' for block ' || b.block_id || ', replay has '
           || b.holders || ' holder(s)'
           || CASE WHEN q.request_id IS NOT NULL
                   THEN ' (last changed by request ' || q.request_id || '''s '
                        || CASE c.op WHEN 'kept' THEN 'free or preemption, which kept it back'
                                ELSE c.op END || ')'
                   ELSE '' END
FROM bad b
ASOF LEFT JOIN changes c ON c.block_id = b.block_id AND c.event < b.event
LEFT JOIN replay_request q ON q.rkey = c.rkey;

-- name: replay_check_free_count
-- The engine's observed free-block count differs from the pool size minus the blocks held
-- (and the reserved ones). Only when the header gives num_gpu_blocks.
-- Plan: blocks in use change when a block's holders go 0 -> 1 or 1 -> 0; those changes are
-- summed per step and run over the steps (a sort of the steps, not of the events); an
-- observation made before the last change of its step (rare: engines observe at the end of
-- a step) takes back the changes after it, read for those steps only.
WITH used_change AS (
    SELECT event, step, CASE WHEN delta = 1 AND holders = 1 THEN 1
                             WHEN delta = -1 AND holders = 0 THEN -1 ELSE 0 END AS d
    FROM replay_holder_change WHERE delta <> 0
), per_step AS (
    SELECT step, sum(d) AS d, max(event) AS last_change FROM used_change GROUP BY step
), through AS (
    SELECT step, last_change,
           sum(d) OVER (ORDER BY step ROWS UNBOUNDED PRECEDING) AS used FROM per_step
), probes AS (
    SELECT o.event, o.step, o.op, o.value, l.num_gpu_blocks - len(l.reserved_blocks) AS pool
    FROM replay_event o CROSS JOIN replay_log l
    WHERE o.op = 'observe_free' AND l.num_gpu_blocks IS NOT NULL
), at_step AS (  -- blocks in use at the end of the observation's step (or the last before)
    SELECT p.*, coalesce(t.used, 0) AS used, t.step = p.step AND t.last_change > p.event AS early
    FROM probes p ASOF LEFT JOIN through t ON t.step <= p.step
), later AS (  -- an observation made before some change of its own step: those undone
    SELECT a.event, sum(u.d) AS d
    FROM at_step a
    JOIN (SELECT u.* FROM used_change u
          JOIN (SELECT DISTINCT step FROM at_step WHERE early) k ON k.step = u.step) u
      ON u.step = a.step AND u.event > a.event
    WHERE a.early
    GROUP BY a.event
), expected AS (
    SELECT a.event, a.step, a.op, a.value, a.pool - a.used + coalesce(l.d, 0) AS free
    FROM at_step a LEFT JOIN later l USING (event)
)
SELECT 'free_count', event, step, op, NULL, NULL, NULL, NULL,
       free || ' free block(s) replayed', value || ' free',
       'engine reports ' || value || ' free block(s), replay has ' || free
FROM expected WHERE value <> free;

-- name: replay_check_stale_token
-- A token resolving to a block that changed hands since it was written: a block allocated
-- fresh or evicted while a holder has tokens in it, or a block acquired (allocate, share)
-- for a block index whose tokens were written before it.
-- Plan: the candidates (holders of a block handed out fresh or evicted; every allocate and
-- share) are matched with replay_written by (rkey, block_index): a hash join, no token count
-- per event. The token count a message names is read for the few findings only.
WITH fresh AS (
    SELECT event, step, op, rkey, block_id FROM replay_holder_change
    WHERE (delta = 1 AND op IN ('allocate', 'swap_in') AND holders > 1)
       OR (delta = 0 AND op = 'evict')
), victims AS (
    SELECT f.event, f.step, f.op, f.rkey AS taker, f.block_id, o.rkey, o.block_index,
           'victim' AS kind
    FROM fresh f
    JOIN replay_location o
      ON o.tier = 'gpu' AND o.block_id = f.block_id AND o.from_event < f.event
     AND (o.to_event IS NULL OR o.to_event > f.event)
), candidates AS (
    SELECT * FROM victims
    UNION ALL
    SELECT from_event, from_step, kind, NULL, block_id, rkey, block_index, 'late'
    FROM replay_location WHERE kind IN ('allocate', 'share')
), hits AS (
    SELECT c.*, w.event AS written_event
    FROM candidates c
    JOIN replay_written w
      ON w.rkey = c.rkey AND w.block_index = c.block_index AND w.event < c.event
     AND (w.end_event IS NULL OR w.end_event > c.event)
), appends AS (  -- the appends of the requests found only (a join with their distinct
                 -- keys: a semi join was planned with its hash table on the appends)
    SELECT a.rkey, a.event, a.token_to FROM replay_event a
    JOIN (SELECT DISTINCT rkey FROM hits) k ON k.rkey = a.rkey
    WHERE a.op = 'append'
), counted AS (
    SELECT h.event, h.step, h.op, h.taker, h.block_id, h.rkey, h.block_index, h.kind,
           max(a.token_to) AS tokens
    FROM hits h
    JOIN appends a ON a.rkey = h.rkey AND a.event >= h.written_event AND a.event < h.event
    GROUP BY ALL
)
SELECT 'stale_token', c.event, c.step, c.op, q.request_id, t.request_id, c.block_id,
       c.block_index,
       CASE c.kind WHEN 'victim' THEN 'block keeps the tokens written to it'
                   ELSE 'tokens written after their block' END,
       CASE c.kind WHEN 'victim' THEN 'block ' || c.op || 'ed'
                   ELSE c.tokens || ' token(s) written before' END,
       CASE c.kind
           WHEN 'victim' THEN 'tokens ' || (c.block_index * q.block_size) || '..'
               || (least(c.tokens, (c.block_index + 1) * q.block_size) - 1) || ' of request '
               || q.request_id || ' were written to block ' || c.block_id || ', which is now '
               || CASE WHEN c.op = 'evict' THEN 'evicted'
                       ELSE 'handed to request ' || t.request_id END
           ELSE 'request ' || q.request_id || ' had written tokens '
               || (c.block_index * q.block_size) || '..'
               || (least(c.tokens, (c.block_index + 1) * q.block_size) - 1) || ' before block '
               || c.block_id || ' became its block ' || c.block_index END
               || replay_in_group(q.group_id)
FROM counted c
JOIN replay_request q ON q.rkey = c.rkey
LEFT JOIN replay_request t ON t.rkey = c.taker;

-- name: replay_check_freed_request_referenced
-- An event naming a request (or a fork's parent) after that request was freed.
-- Plan: replay_request knows each request's free and last event, so only the requests
-- named after their free are looked up; a fork's parent, by the fork rows only.
WITH late AS (
    SELECT rkey, request_id, free_event, free_step FROM replay_request
    WHERE free_event IS NOT NULL AND last_event > free_event
), refs AS (
    SELECT e.event, e.step, e.op, e.rkey AS named, e.rkey, e.block_id FROM replay_event e
    SEMI JOIN late f ON f.rkey = e.rkey AND e.event > f.free_event
    UNION ALL
    SELECT e.event, e.step, e.op, p.rkey, e.rkey, e.block_id
    FROM replay_event e JOIN replay_request p ON p.request_id = e.parent
    WHERE e.parent IS NOT NULL AND e.event > p.free_event
)
SELECT 'freed_request_referenced', r.event, r.step, r.op, f.request_id,
       NULLIF(q.request_id, f.request_id), r.block_id, NULL,
       'no event after step ' || f.free_step, r.op,
       'request ' || f.request_id || ' was freed at step ' || f.free_step || ' but ' || r.op
           || ' names it' AS message
FROM refs r
JOIN replay_request f ON f.rkey = r.named AND r.event > f.free_event
LEFT JOIN replay_request q ON q.rkey = r.rkey;

-- name: replay_check_unresolved_token
-- A token with no block: written to a block index the request has no entry for (resident or
-- swapped) at the end of that step, or left behind when its block was released; of a
-- sliding window, a token the window keeps.
-- Plan: appends are contiguous, so the steps in which a block index gets tokens run from its
-- replay_written row to the next index's (or the request's last append): one location
-- interval covering that span clears the index (almost all of them), with no pass over the
-- appends. The others' requests are checked append by append. A release is checked
-- against replay_written (tokens in that block index in this life). A sliding window of W
-- tokens keeps positions n - W + 1 on of a request with n tokens, a chunked local attention
-- of C tokens positions n // C * C on (replay_kept_from, per the row's group); a block out
-- of the window (a prefix hit's placeholder) or released by a window free at n (a release
-- whose value is n) is no finding, a window free of a block the window still needs is. A
-- window free is judged at the tokens the request holds then (the release's token_to, which
-- the reader writes; else its last append, found by an ASOF join), never at more: a count
-- larger than the request's (an engine counting drafts or lookahead) frees KV the window
-- still reads, and the message names both counts and only the tokens still read.
WITH spans AS (
    SELECT w.rkey, w.block_index, w.step AS lo,
           coalesce(n.step, least(w.end_step, q.last_append_step), q.last_append_step) AS hi
    FROM replay_written w
    JOIN replay_request q ON q.rkey = w.rkey
    LEFT JOIN replay_written n
      ON n.rkey = w.rkey AND n.block_index = w.block_index + 1 AND n.event > w.event
     AND n.end_event IS NOT DISTINCT FROM w.end_event
), suspect AS MATERIALIZED (
    SELECT DISTINCT s.rkey FROM spans s
    ANTI JOIN replay_location o
      ON o.rkey = s.rkey AND o.block_index = s.block_index
     AND o.from_step <= s.lo AND (o.to_step IS NULL OR o.to_step > s.hi)
), cells AS (
    SELECT e.event, e.step, e.rkey, e.token_from, e.token_to,
           unnest(range(e.token_from // q.block_size, (e.token_to - 1) // q.block_size + 1))
               AS block_index
    FROM replay_event e JOIN suspect k ON k.rkey = e.rkey
    JOIN replay_request q ON q.rkey = e.rkey
    WHERE e.op = 'append' AND e.token_to > e.token_from
), kept AS (
    SELECT c.* FROM cells c JOIN replay_request q ON q.rkey = c.rkey
    WHERE (c.block_index + 1) * q.block_size
          > replay_kept_from(c.token_to, q.sliding_window, q.attention_chunk_size)
), missing AS (
    SELECT c.* FROM kept c
    ANTI JOIN replay_location o
      ON o.rkey = c.rkey AND o.block_index = c.block_index
     AND o.from_step <= c.step AND (o.to_step IS NULL OR o.to_step > c.step)
), released AS (
    SELECT o.to_event AS event, o.to_step AS step, o.rkey, o.block_id, o.block_index,
           w.event AS written_event, e.value AS measured, e.token_to AS held
    FROM replay_location o
    JOIN replay_written w
      ON w.rkey = o.rkey AND w.block_index = o.block_index AND w.event < o.to_event
     AND (w.end_event IS NULL OR w.end_event > o.to_event)
    JOIN replay_event e ON e.event = o.to_event
    WHERE o.end_op = 'release'
), unheld AS (  -- a plain release, or a window free of a table written without its count
    SELECT * FROM released WHERE held IS NULL
), appends AS (
    SELECT a.rkey, a.event, a.token_to FROM replay_event a
    JOIN (SELECT DISTINCT rkey FROM unheld) k ON k.rkey = a.rkey
    WHERE a.op = 'append' AND a.token_to IS NOT NULL
), counted AS (
    SELECT * FROM released WHERE held IS NOT NULL
    UNION ALL
    SELECT r.* REPLACE (a.token_to AS held)
    FROM unheld r ASOF JOIN appends a ON a.rkey = r.rkey AND r.event > a.event
), released_tokens AS (
    SELECT r.*, r.held AS tokens,
           CASE WHEN r.measured IS NOT NULL
                THEN replay_kept_from(least(r.measured, r.held), q.sliding_window,
                                      q.attention_chunk_size)
                ELSE 0 END AS read_from
    FROM counted r
    JOIN replay_request q ON q.rkey = r.rkey
)
SELECT 'unresolved_token', m.event, m.step, 'append', q.request_id, NULL, NULL, m.block_index,
       'block ' || m.block_index || ' resident or swapped', 'no block',
       'tokens ' || greatest(m.token_from, m.block_index * q.block_size) || '..'
           || (least(m.token_to, (m.block_index + 1) * q.block_size) - 1) || ' of request '
           || q.request_id || ' have no block ' || m.block_index || replay_in_group(q.group_id)
FROM missing m JOIN replay_request q ON q.rkey = m.rkey
UNION ALL
SELECT 'unresolved_token', r.event, r.step, 'release', q.request_id, NULL, r.block_id,
       r.block_index, 'no tokens in a released block', r.tokens || ' token(s)',
       'request ' || q.request_id || ' released block ' || r.block_id || ' (its block '
           || r.block_index || ') with tokens '
           || greatest(r.block_index * q.block_size, r.read_from) || '..'
           || (least(r.tokens, (r.block_index + 1) * q.block_size) - 1)
           || CASE WHEN r.measured IS NULL THEN ' in it'
                   ELSE ' in it that its window still reads (a window free at ' || r.measured
                        || ' token(s)' || CASE WHEN r.measured > r.tokens
                                               THEN ', but the request holds ' || r.tokens
                                               ELSE '' END || ')' END
           || replay_in_group(q.group_id)
FROM released_tokens r JOIN replay_request q ON q.rkey = r.rkey
WHERE (r.block_index + 1) * q.block_size > r.read_from;

-- name: replay_check_hit_length_mismatch
-- A prefix hit whose length in tokens (the share's entries, placeholders included, times
-- the group's block size) differs between the KV-cache groups of one lookup (a request's
-- hits in one step): vLLM's hybrid coordinator gives every group the same hit length, so a
-- group that reuses fewer tokens than the others reads KV it never computed for them. Only
-- a log of several groups has hit rows (one per group of each share).
-- Plan: the hit rows, few, grouped by request and step.
WITH h AS (
    SELECT e.event, e.step, q.request_id, q.group_id, e.token_to AS tokens
    FROM replay_event e JOIN replay_request q ON q.rkey = e.rkey
    WHERE e.op = 'hit'
), lookups AS (
    SELECT request_id, step, max(event) AS event,
           string_agg('group ' || group_id || ' ' || tokens, ', ' ORDER BY group_id)
               AS per_group
    FROM h GROUP BY request_id, step HAVING min(tokens) <> max(tokens)
)
SELECT 'hit_length_mismatch', event, step, 'share', request_id, NULL, NULL, NULL,
       'one hit length in every group', per_group || ' tokens',
       'the prefix hit of request ' || request_id || ' reuses ' || per_group
           || ' tokens: every KV-cache group of one lookup reuses the same tokens'
FROM lookups;

-- name: replay_check_duplicate_block
-- One block twice in one request's block table (vLLM #42571: freed twice later).
-- Plan: a hash aggregate finds the (request, block) pairs with more than one GPU interval
-- (rare); only their intervals are compared with each other.
WITH g AS (
    SELECT rkey, block_id, block_index, kind, from_event, from_step, to_event
    FROM replay_location WHERE tier = 'gpu'
), multi AS (
    SELECT rkey, block_id FROM g GROUP BY rkey, block_id HAVING count(*) > 1
), m AS (
    SELECT g.* FROM g SEMI JOIN multi USING (rkey, block_id)
), dup AS (
    SELECT a.from_event AS event, a.from_step AS step, a.kind AS op, a.rkey, a.block_id,
           a.block_index, 1 + count(*) AS held_by_request
    FROM m a
    JOIN m b
      ON b.rkey = a.rkey AND b.block_id = a.block_id AND b.from_event < a.from_event
     AND (b.to_event IS NULL OR b.to_event > a.from_event)
    GROUP BY ALL
)
SELECT 'duplicate_block', d.event, d.step, d.op, q.request_id, NULL, d.block_id,
       d.block_index, 'block once in the table', d.held_by_request || ' times',
       'block ' || d.block_id || ' is ' || d.held_by_request || ' times in the block table of '
           || 'request ' || q.request_id || ' (now also at block index ' || d.block_index || ')'
           || replay_in_group(q.group_id)
FROM dup d JOIN replay_request q ON q.rkey = d.rkey;

-- name: replay_check_evict_held
-- A block evicted from the prefix cache while an entry holds it, naming the requests that
-- hold it.
-- Plan: the evictions of held blocks are few; only their blocks' intervals are read.
WITH bad AS MATERIALIZED (
    SELECT event, step, op, block_id, holders FROM replay_holder_change
    WHERE delta = 0 AND op = 'evict' AND holders > 0
)
SELECT 'evict_held', b.event, b.step, b.op, NULL, string_agg(DISTINCT q.request_id, ','
                                                          ORDER BY q.request_id),
       b.block_id, NULL, 'no holder', b.holders || ' holder(s)',
       'block ' || b.block_id || ' evicted while request(s) '
           || string_agg(DISTINCT q.request_id, ', ' ORDER BY q.request_id) || ' hold it'
FROM bad b
JOIN replay_location o
  ON o.tier = 'gpu' AND o.block_id = b.block_id AND o.from_event < b.event
 AND (o.to_event IS NULL OR o.to_event > b.event)
JOIN replay_request q ON q.rkey = o.rkey
GROUP BY b.event, b.step, b.op, b.block_id, b.holders;

-- name: replay_check_outside_pool
-- A block id outside the pool (0 .. num_gpu_blocks-1), or a reserved block handed out.
SELECT 'outside_pool', e.event, e.step, e.op, q.request_id, NULL, e.block_id,
       e.block_index,
       'block id in 0..' || (l.num_gpu_blocks - 1) || ', not reserved',
       'block ' || e.block_id,
       CASE WHEN list_contains(l.reserved_blocks, e.block_id)
            THEN 'reserved block ' || e.block_id || ' handed to request ' || q.request_id
            ELSE 'block ' || e.block_id || ' is outside the pool of ' || l.num_gpu_blocks
                 || ' blocks' END
FROM replay_event e CROSS JOIN replay_log l
LEFT JOIN replay_request q ON q.rkey = e.rkey
WHERE e.op IN ('allocate', 'share', 'fork', 'swap_in')
  AND (e.block_id >= l.num_gpu_blocks
       OR (e.op IN ('allocate', 'share', 'swap_in') AND list_contains(l.reserved_blocks, e.block_id)));

-- name: replay_check_unaligned_cpu_address
-- A block swapped out to a CPU address that is not 256-byte aligned (check's
-- diag_unaligned_cpu_address, at the step it happened).
SELECT 'unaligned_cpu_address', e.event, e.step, e.op, q.request_id, NULL, e.block_id,
       e.block_index, 'cpu address a multiple of 256', 'cpu address ' || e.cpu_address,
       'block ' || e.block_id || ' of request ' || q.request_id
           || ' swapped out to cpu address ' || e.cpu_address || ', not 256-byte aligned'
FROM replay_event e LEFT JOIN replay_request q ON q.rkey = e.rkey
WHERE e.op = 'swap_out' AND e.cpu_address % 256 <> 0;

-- name: replay_finding_causes
-- Every finding of _replay_found (a check of a --keep-going run) with its cause: for a
-- consequence (a check whose idea the catalogue says another can cause: the triples
-- (check, cause check, cause idea) are spliced in for $CAUSES), the latest finding of a
-- cause check at its step or before that names the same block (or, when it names no block,
-- the same request), said as "<idea> at step N (request r; block b)"; NULL for a root cause.
-- Plan: findings are few; each consequence meets its candidates by one hash join on its
-- block (or request), and arg_max keeps the latest.
WITH f AS (
    SELECT *, row_number() OVER () AS fid FROM _replay_found
), pairs(check_name, cause_check, cause_idea) AS ($CAUSES),
cand AS (
    SELECT f.fid, p.cause_idea, g.step, g.event, g.request, g.block_id
    FROM f
    JOIN pairs p ON p.check_name = f.check_name
    JOIN _replay_found g
      ON g.check_name = p.cause_check AND g.step <= f.step
     AND (g.block_id = f.block_id OR (f.block_id IS NULL AND g.request = f.request))
), best AS (
    SELECT fid,
           arg_max(cause_idea || ' at step ' || step
                       || CASE WHEN request IS NULL AND block_id IS NULL THEN ''
                               ELSE ' (' || concat_ws('; ', 'request ' || request,
                                                      'block ' || block_id) || ')' END,
                   event) AS cause
    FROM cand GROUP BY fid
)
SELECT f.check_name, f.event, f.step, f.op, f.request, f.other_requests, f.block_id,
       f.block_index, f.expected, f.found, f.message, b.cause
FROM f LEFT JOIN best b USING (fid)
-- name: replay_check_leak
-- A block a request held that its free (or preemption) did not give back to the pool (the
-- op's handed blocks, ending the entry as kept), while no other entry holds it: the engine
-- still counts it in use, and it never returns to the free list (a leak). Kept back while
-- others hold it, the engine's count stays one too high: refcount_mismatch at its
-- observation.
-- Plan: a filter on replay_holder_change (the kept ends, with the holders left).
SELECT 'leak', h.event, h.step, h.op, q.request_id, NULL, h.block_id, h.block_index,
       'block given back to the pool', 'kept back, no holder',
       'request ' || q.request_id || ' let go of block ' || h.block_id || ' (its block index '
           || h.block_index || ') without giving it back to the pool, and no entry holds it: '
           || 'it never returns to the free list'
FROM replay_holder_change h
JOIN replay_request q ON q.rkey = h.rkey
WHERE h.delta = -1 AND h.op = 'kept' AND h.holders = 0;

-- name: replay_check_held_free_block
-- A block the engine's free list holds (observed) while entries hold it: the next
-- allocation hands it out again under its holders (the engine views' held_free_block).
-- Named by its holders: the first request, the others in other_requests.
-- Plan: the observations with holders (replay_holder_change, delta 0) are few; only their
-- blocks' intervals are read, to name the holders.
WITH bad AS MATERIALIZED (
    SELECT event, step, op, block_id, holders FROM replay_holder_change
    WHERE delta = 0 AND op = 'observe_free_list' AND holders > 0
), named AS (  -- each holding request once, at its lowest block index
    SELECT b.event, b.step, b.op, b.block_id, b.holders, q.request_id,
           min(o.block_index) AS block_index
    FROM bad b
    JOIN replay_location o
      ON o.tier = 'gpu' AND o.block_id = b.block_id AND o.from_event < b.event
     AND (o.to_event IS NULL OR o.to_event > b.event)
    JOIN replay_request q ON q.rkey = o.rkey
    GROUP BY ALL
)
SELECT 'held_free_block', event, step, op, min(request_id),
       NULLIF(array_to_string(list_sort(list(request_id))[2:], ','), ''), block_id,
       arg_min(block_index, request_id), 'held blocks out of the free list',
       'in the free list, ' || holders || ' holder(s)',
       'block ' || block_id || ' is in the engine''s free list while request(s) '
           || array_to_string(list_sort(list(request_id)), ', ') || ' hold it'
FROM named
GROUP BY event, step, op, block_id, holders;

-- name: replay_check_free_list_duplicate
-- A block the engine's free list holds more than once (observed): it was pushed again
-- with no allocation between, a double free; named by the request whose event last
-- changed the block's holders (the free that pushed it again).
-- Plan: as refcount_mismatch: the few duplicates meet the last change of their block by
-- one ASOF join against the changes of those blocks only.
WITH bad AS MATERIALIZED (
    SELECT event, step, op, block_id, value FROM replay_holder_change
    WHERE delta = 0 AND op = 'observe_free_list' AND value > 1
), changes AS (
    SELECT block_id, event, rkey, op FROM replay_holder_change
    WHERE delta <> 0 AND block_id IN (SELECT block_id FROM bad)
)
SELECT 'free_list_duplicate', b.event, b.step, b.op, q.request_id, NULL, b.block_id, NULL,
       'block once in the free list', b.value || ' times in the free list',
       'block ' || b.block_id || ' is ' || b.value || ' times in the engine''s free list '
           || '(given back again with no allocation between)'
           || CASE WHEN q.request_id IS NOT NULL
                   THEN ' (last released by request ' || q.request_id || '''s '
                        || CASE c.op WHEN 'kept' THEN 'free or preemption, which kept it back'
                                ELSE c.op END || ')'
                   ELSE '' END
FROM bad b
ASOF LEFT JOIN changes c ON c.block_id = b.block_id AND c.event < b.event
LEFT JOIN replay_request q ON q.rkey = c.rkey;

-- name: replay_check_prefix_hash
-- A prefix-cache hit on a block whose cached hash is not the one the request asked for
-- (another prefix's KV, or the right blocks in the wrong order): at the share, against
-- the block's hash then (the last cache of the block, unless an evict dropped it since),
-- or at a cache of a block under another hash while a sharer holds it for the one it
-- asked for. A hash not known on either side (an uncached block, a share without hashes)
-- compares with nothing.
-- Plan: the shares that asked a hash meet the block's last cache or evict before them by
-- one ASOF join (both sides a filter of replay_event); the caches (few) meet the share
-- intervals of their block in replay_location, and those shares' asked hash by event.
WITH hashed AS (
    SELECT block_id, event, op, value FROM replay_event WHERE op IN ('cache', 'evict')
), asks AS MATERIALIZED (
    SELECT event, step, rkey, block_index, block_id, value FROM replay_event
    WHERE op = 'share' AND value IS NOT NULL AND block_index IS NOT NULL
), at_share AS (
    SELECT a.event, a.step, 'share' AS op, a.rkey, a.block_id, a.block_index,
           a.value AS asked, h.value AS cached
    FROM asks a ASOF JOIN hashed h ON h.block_id = a.block_id AND a.event > h.event
    WHERE h.op = 'cache' AND h.value <> a.value
), at_cache AS (
    SELECT c.event, c.step, 'cache' AS op, o.rkey, c.block_id, o.block_index,
           a.value AS asked, c.value AS cached
    FROM (SELECT event, step, block_id, value FROM replay_event WHERE op = 'cache') c
    JOIN replay_location o
      ON o.kind = 'share' AND o.block_id = c.block_id AND o.from_event < c.event
     AND (o.to_event IS NULL OR o.to_event > c.event)
    JOIN asks a ON a.event = o.from_event
    WHERE a.value <> c.value
)
SELECT 'prefix_hash', x.event, x.step, x.op, q.request_id, NULL, x.block_id,
       x.block_index, 'hash ' || lpad(lower(hex(x.asked)), 16, '0'),
       'hash ' || lpad(lower(hex(x.cached)), 16, '0'),
       CASE x.op
           WHEN 'share' THEN 'request ' || q.request_id || ' shares block ' || x.block_id
               || ' as its block ' || x.block_index || ' for hash '
               || lpad(lower(hex(x.asked)), 16, '0') || ', but the block is cached under '
               || lpad(lower(hex(x.cached)), 16, '0') || ': a prefix hit on another''s KV'
           ELSE 'block ' || x.block_id || ' is cached under hash '
               || lpad(lower(hex(x.cached)), 16, '0') || ' while request ' || q.request_id
               || ' holds it as its block ' || x.block_index || ' for hash '
               || lpad(lower(hex(x.asked)), 16, '0') || ': a prefix hit on another''s KV' END
FROM (SELECT * FROM at_share UNION ALL SELECT * FROM at_cache) x
JOIN replay_request q ON q.rkey = x.rkey;

-- name: replay_entries_at
-- The block-table entries at the end of step n (a filter over the intervals).
CREATE OR REPLACE MACRO replay_entries_at(n) AS TABLE
SELECT q.request_id AS request, q.seq_id AS seq, e.block_index, e.tier, e.block_id,
       e.cpu_address
FROM replay_location e JOIN replay_request q ON q.rkey = e.rkey AND q.is_primary
WHERE e.from_step <= n AND (e.to_step IS NULL OR e.to_step > n);

-- name: replay_tokens_at
-- Each request's token count at the end of step n.
-- Plan: the last block index that got a token in the request's life at n
-- (replay_written), then the appends since that one: never the whole log's appends.
CREATE OR REPLACE MACRO replay_tokens_at(n) AS TABLE
WITH last_written AS (
    SELECT rkey, max(event) AS since FROM replay_written
    WHERE step <= n AND (end_step IS NULL OR end_step > n)
    GROUP BY rkey
), counts AS (
    SELECT a.rkey, max(a.token_to) AS tokens
    FROM replay_event a JOIN last_written w ON a.rkey = w.rkey AND a.event >= w.since
    WHERE a.op = 'append' AND a.step <= n
    GROUP BY a.rkey
)
SELECT q.request_id AS request, c.tokens, q.seq_id AS seq
FROM counts c JOIN replay_request q ON q.rkey = c.rkey AND q.is_primary
WHERE c.tokens > 0;

-- name: replay_requests_at
-- The requests alive at the end of step n.
CREATE OR REPLACE MACRO replay_requests_at(n) AS TABLE
SELECT seq_id, request_id FROM replay_request
WHERE is_primary AND arrive_step <= n AND (free_step IS NULL OR free_step > n);

-- name: replay_root_table_at
-- root_table at step n: one block table per request, seq_id = block_table_ptr.
CREATE OR REPLACE MACRO replay_root_table_at(n) AS TABLE
SELECT seq_id, seq_id AS block_table_ptr FROM replay_requests_at(n);

-- name: replay_block_table_entry_at
-- block_table_entry at step n: base = gpu_base + block_id * block_bytes, refcount = the
-- entries holding that block.
CREATE OR REPLACE MACRO replay_block_table_entry_at(n) AS TABLE
SELECT q.seq_id AS block_table_id, e.block_index,
       l.gpu_base + e.block_id * l.block_bytes AS physical_block_base,
       count(*) OVER (PARTITION BY e.block_id) AS refcount
FROM replay_location e CROSS JOIN replay_log l
JOIN replay_request q ON q.rkey = e.rkey AND q.is_primary
WHERE e.tier = 'gpu' AND e.from_step <= n AND (e.to_step IS NULL OR e.to_step > n);

-- name: replay_swapped_block_at
-- swapped_block at step n.
CREATE OR REPLACE MACRO replay_swapped_block_at(n) AS TABLE
SELECT q.seq_id AS block_table_id, e.block_index, e.cpu_address AS cpu_base_address
FROM replay_location e JOIN replay_request q ON q.rkey = e.rkey AND q.is_primary
WHERE e.tier = 'cpu' AND e.from_step <= n AND (e.to_step IS NULL OR e.to_step > n);

-- name: replay_virtual_token_at
-- virtual_token at step n: token p of a request is (p / block_size, p % block_size). Of a
-- window (the primary group's: replay_kept_from), a request with t tokens has the tokens
-- its window keeps (the others' KV is gone from the cache).
CREATE OR REPLACE MACRO replay_virtual_token_at(n) AS TABLE
SELECT seq_id, token_pos, token_pos // block_size AS block_index,
       token_pos % block_size AS offset_in_block
FROM (
    SELECT t.seq AS seq_id, q.block_size,
           unnest(range(replay_kept_from(t.tokens, q.sliding_window, q.attention_chunk_size),
                        t.tokens)) AS token_pos
    FROM replay_tokens_at(n) t
    JOIN replay_request q ON q.seq_id = t.seq AND q.is_primary
);

-- name: replay_diff_macro
-- What changed between the end of step a and the end of step b: block-table entries added,
-- removed, moved between tiers or blocks; requests arrived or gone; tokens; refcounts.
CREATE OR REPLACE MACRO replay_diff(a, b) AS TABLE
WITH ea AS (SELECT * FROM replay_entries_at(a)), eb AS (SELECT * FROM replay_entries_at(b)),
entries AS (
    SELECT CASE WHEN ea.request IS NULL THEN 'entry added'
                WHEN eb.request IS NULL THEN 'entry removed'
                WHEN ea.tier = 'gpu' AND eb.tier = 'cpu' THEN 'swapped out'
                WHEN ea.tier = 'cpu' AND eb.tier = 'gpu' THEN 'swapped in'
                ELSE 'moved' END AS change,
           coalesce(ea.request, eb.request) AS request,
           coalesce(ea.block_index, eb.block_index) AS block_index,
           NULL::BIGINT AS block_id,
           CASE ea.tier WHEN 'gpu' THEN 'gpu block ' || ea.block_id
                        WHEN 'cpu' THEN 'cpu ' || ea.cpu_address END AS before,
           CASE eb.tier WHEN 'gpu' THEN 'gpu block ' || eb.block_id
                        WHEN 'cpu' THEN 'cpu ' || eb.cpu_address END AS after
    FROM ea FULL JOIN eb ON ea.request = eb.request AND ea.block_index = eb.block_index
    WHERE ea.request IS NULL OR eb.request IS NULL OR ea.tier <> eb.tier
       OR ea.block_id IS DISTINCT FROM eb.block_id
       OR ea.cpu_address IS DISTINCT FROM eb.cpu_address
), ra AS (SELECT * FROM replay_requests_at(a)), rb AS (SELECT * FROM replay_requests_at(b)),
requests AS (
    SELECT CASE WHEN ra.request_id IS NULL THEN 'request arrived' ELSE 'request gone' END
               AS change,
           coalesce(ra.request_id, rb.request_id) AS request, NULL::BIGINT AS block_index,
           NULL::BIGINT AS block_id, NULL::VARCHAR AS before, NULL::VARCHAR AS after
    FROM ra FULL JOIN rb ON ra.request_id = rb.request_id
    WHERE ra.request_id IS NULL OR rb.request_id IS NULL
), tokens AS (
    SELECT 'tokens' AS change, coalesce(ta.request, tb.request) AS request,
           NULL::BIGINT AS block_index, NULL::BIGINT AS block_id,
           coalesce(ta.tokens, 0)::VARCHAR AS before, coalesce(tb.tokens, 0)::VARCHAR AS after
    FROM replay_tokens_at(a) ta FULL JOIN replay_tokens_at(b) tb ON ta.request = tb.request
    WHERE coalesce(ta.tokens, 0) <> coalesce(tb.tokens, 0)
), refs AS (
    SELECT 'refcount' AS change, NULL::VARCHAR AS request, NULL::BIGINT AS block_index,
           coalesce(x.block_id, y.block_id) AS block_id,
           coalesce(x.n, 0)::VARCHAR AS before, coalesce(y.n, 0)::VARCHAR AS after
    FROM (SELECT block_id, count(*) AS n FROM ea WHERE tier = 'gpu' GROUP BY ALL) x
    FULL JOIN (SELECT block_id, count(*) AS n FROM eb WHERE tier = 'gpu' GROUP BY ALL) y
      ON x.block_id = y.block_id
    WHERE coalesce(x.n, 0) <> coalesce(y.n, 0)
)
SELECT * FROM (
    SELECT * FROM entries
    UNION ALL SELECT * FROM requests
    UNION ALL SELECT * FROM tokens
    UNION ALL SELECT * FROM refs
) ORDER BY change, request NULLS LAST, block_index NULLS LAST, block_id NULLS LAST;

-- name: replay_request_label
-- The engine's request id of each seq_id, for check, explain and resolve --format table
-- (the view a capability names requests with; replay --at and apply point it here; a
-- replayed request has a row per KV-cache group, all with its seq_id).
CREATE OR REPLACE VIEW pagedkv_request_label AS
SELECT DISTINCT seq_id, request_id FROM replay_request;

-- Applying one step as a transaction (pagedkv_sql/replay/apply.py, Database.apply): the
-- touched keys read by key, the step checked in a scratch database, the touched rows
-- rewritten. The statements whose table or id list changes with the step stay in apply.py.

-- name: apply_live_request
-- replay_request for a database that was loaded, not replayed: apply numbers the requests
-- it meets here.
-- Plan: a catalog write, once per database.
CREATE TABLE IF NOT EXISTS replay_request (
    seq_id BIGINT, request_id VARCHAR, arrive_step BIGINT, free_step BIGINT
);

-- name: apply_has_log
-- Whether a replayed log's header (replay_log) is stored.
-- Plan: a catalog lookup.
SELECT count(*) FROM duckdb_tables() WHERE table_name = 'replay_log';

-- name: apply_log_header
-- The stored log's header row: engine, block_size, block_bytes, gpu_base, num_gpu_blocks,
-- reserved_blocks, then the counts, the mark and the KV-cache groups (JSON; a database
-- replayed before groups lacks that column).
-- Plan: a scan of one row.
SELECT * FROM replay_log;

-- name: apply_block_size
-- The stored block_size, the header of a database that was loaded, not replayed.
-- Plan: a filter on pagedkv_settings (a few rows).
SELECT value FROM pagedkv_settings WHERE name = 'block_size';

-- name: apply_last_step
-- The step applied last (parameter: the setting's name), NULL before the first.
-- Plan: a filter on pagedkv_settings (a few rows).
SELECT value FROM pagedkv_settings WHERE name = ?;

-- name: apply_requests_by_id
-- The stored requests a step names (parameter: their ids), freed or not.
-- Plan: a hash semi-join of replay_request with the ids.
SELECT request_id, seq_id, free_step FROM replay_request
WHERE request_id IN (SELECT unnest(?::VARCHAR[]));

-- name: apply_entries_at
-- The state after the step in the scratch log (parameter: the step): every block-table
-- entry of every request.
-- Plan: the interval filter of replay_entries_at.
SELECT request, block_index, tier, block_id, cpu_address FROM replay_entries_at(?);

-- name: apply_tokens_at
-- The tokens each request holds after the step in the scratch log (parameter: the step).
-- Plan: the filter of replay_tokens_at over the appends.
SELECT request, tokens FROM replay_tokens_at(?);

-- name: apply_requests_at
-- The requests alive after the step in the scratch log (parameter: the step).
-- Plan: the filter of replay_requests_at over replay_request.
SELECT * FROM replay_requests_at(?);

-- name: apply_scratch_requests
-- The scratch log's requests with the seq_id replay numbered them with.
-- Plan: a scan of replay_request (the step's requests only).
SELECT request_id, seq_id FROM replay_request;

-- name: apply_last_request_seq
-- The highest seq_id given to a request so far (0: none).
-- Plan: an ungrouped max over replay_request.
SELECT coalesce(max(seq_id), 0) FROM replay_request;

-- name: apply_last_root_seq
-- The highest seq_id of the stored roots (0: none): loaded facts may hold seq_ids too.
-- Plan: an ungrouped max over root_table.
SELECT coalesce(max(seq_id), 0) FROM root_table;

-- name: apply_new_request
-- Number a request the step brings (parameters: seq_id, request id, step).
-- Plan: a one-row append.
INSERT INTO replay_request (seq_id, request_id, arrive_step) VALUES (?, ?, ?);

-- name: apply_free_request
-- Mark a request freed at the step (parameters: step, request id).
-- Plan: a filter on replay_request, one row updated.
UPDATE replay_request SET free_step = ? WHERE request_id = ?;

-- name: apply_delete_entries
-- Drop the block-table entries of the step's requests (_apply_seqs): rewritten after.
-- Plan: a hash semi-join of block_table_entry with _apply_seqs, then the deletes.
DELETE FROM block_table_entry WHERE block_table_id IN (SELECT seq_id FROM _apply_seqs);

-- name: apply_delete_swapped
-- Drop the swapped blocks of the step's requests (_apply_seqs): rewritten after.
-- Plan: a hash semi-join of swapped_block with _apply_seqs, then the deletes.
DELETE FROM swapped_block WHERE block_table_id IN (SELECT seq_id FROM _apply_seqs);

-- name: apply_shrink_tokens
-- Drop the tokens of freed or preempted requests from virtual_token (_apply_shrink: the
-- positions each keeps).
-- Plan: a hash join of virtual_token with _apply_shrink (the step's requests), then the deletes.
DELETE FROM virtual_token USING _apply_shrink s
WHERE virtual_token.seq_id = s.seq_id AND virtual_token.token_pos >= s.keep;

-- name: apply_shrink_touched
-- The same drop from the touched tokens (_apply_tokens).
-- Plan: a hash join of _apply_tokens with _apply_shrink, then the deletes.
DELETE FROM _apply_tokens USING _apply_shrink s
WHERE _apply_tokens.seq_id = s.seq_id AND _apply_tokens.token_pos >= s.keep;

-- name: apply_insert_grown
-- Append the step's new tokens (_apply_grown) to virtual_token.
-- Plan: a scan of _apply_grown appended.
INSERT INTO virtual_token SELECT * FROM _apply_grown;

-- name: apply_touch_grown
-- The new tokens join the touched ones: every grown token is in a touched key.
-- Plan: a hash semi-join of _apply_grown with _apply_keys.
INSERT INTO _apply_tokens SELECT * FROM _apply_grown g SEMI JOIN _apply_keys k
ON g.seq_id = k.seq_id AND g.block_index = k.block_index;

-- name: apply_touched_tokens
-- The tokens of the touched (sequence, block index) keys (_apply_keys), into _apply_tokens.
-- Plan: a hash semi-join of virtual_token with _apply_keys (one scan of virtual_token).
CREATE OR REPLACE TEMP TABLE _apply_tokens AS SELECT vt.* FROM virtual_token vt
SEMI JOIN _apply_keys k ON vt.seq_id = k.seq_id AND vt.block_index = k.block_index;

-- name: apply_resolve_touched
-- resolved_kv_address of the touched tokens (_apply_tokens), as a sorted set.
-- Plan: both resolve macros over _apply_tokens (hash joins with the block tables), one sort.
SELECT DISTINCT * FROM (SELECT * FROM pagedkv_resolve_gpu('_apply_tokens') UNION ALL
SELECT * FROM pagedkv_resolve_cpu('_apply_tokens')) ORDER BY ALL;

-- name: apply_set_last_step
-- Record the step applied last (parameters: the setting's name, the step).
-- Plan: a one-row upsert into pagedkv_settings.
INSERT OR REPLACE INTO pagedkv_settings VALUES (?, ?);

-- name: apply_minus
-- The rows of _apply_a not in _apply_b (the resolved change, both ways), sorted.
-- Plan: a hash set difference, one sort of the difference.
SELECT * FROM _apply_a EXCEPT SELECT * FROM _apply_b ORDER BY ALL;
