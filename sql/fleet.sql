-- A fleet behind a KV-aware router (docs/fleet.md): events, truth, belief, decisions,
-- outcomes and the checks over them; created by pagedkv_sql.fleet.tables (not the core
-- schema). Hashes: vLLM's published integer folded to signed BIGINT; times: seconds.

-- name: fleet_views
-- The derived relations and the checks (docs/fleet.md), over sql/fleet_load.sql's tables;
-- each relation another reads more than once is materialized once, in order.
-- Plan: each a window over one relation sorted by its key and time (intervals from
-- ordered ops, islands from a running sum), joins on (replica, hash) with time ranges.
-- fleet_truth: what each replica held: (replica, grp, hash) from t_from to t_to, with the
-- number of physical copies (blocks cached under the hash), from its step log's cache and
-- evict ops; a block holds its hash from its cache until its next evict or cache.
CREATE OR REPLACE TABLE fleet_truth AS
WITH grouped AS (  -- a cached block's group: its last allocate's, that step's first (one pool)
    SELECT o.*, coalesce(last_value(CASE WHEN op = 'allocate' THEN grp END IGNORE NULLS) OVER (
               PARTITION BY replica, block_id ORDER BY step, op <> 'allocate', event
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW), grp) AS g
    FROM fleet_step_op o
), ops AS (
    SELECT o.replica, o.g AS grp, o.block_id, o.op, o.hash, round(o.step * m.step_seconds, 9) AS t,
           lead(round(o.step * m.step_seconds, 9), 1, m.t_end) OVER (
               PARTITION BY o.replica, o.block_id ORDER BY o.step, o.event) AS t_next
    FROM grouped o, fleet_meta m WHERE o.op IN ('cache', 'evict')
), held AS (
    SELECT replica, grp, hash, t, t_next FROM ops WHERE op = 'cache' AND t < t_next
), delta AS (
    SELECT replica, grp, hash, t, sum(d) AS d FROM (
        SELECT replica, grp, hash, t, 1 AS d FROM held
        UNION ALL SELECT replica, grp, hash, t_next, -1 FROM held
    ) GROUP BY ALL
), run AS (
    SELECT replica, grp, hash, t AS t_from,
           lead(t) OVER (PARTITION BY replica, grp, hash ORDER BY t) AS t_to,
           sum(d) OVER (PARTITION BY replica, grp, hash ORDER BY t) AS copies
    FROM delta
)
SELECT replica, grp, hash, t_from, t_to, copies FROM run WHERE copies > 0 AND t_to > t_from;

-- fleet_claimed: the events folded per hash WITH COUNTS (a store +1, a removal -1, never
-- below 0, a clear empties the rank); `as_set`: folded as a set, as an index folds them.
CREATE OR REPLACE TABLE fleet_claimed_steps AS
WITH ordered AS (
    SELECT *, sum(CASE WHEN kind = 'cleared' THEN 1 ELSE 0 END) OVER (
                  PARTITION BY replica, dp_rank ORDER BY seq, pos) AS epoch
    FROM fleet_event WHERE kind IN ('stored', 'removed', 'cleared')
), clears AS (
    SELECT replica, dp_rank, epoch, ts AS t_clear FROM ordered WHERE kind = 'cleared'
), hashed AS (
    SELECT o.replica, o.dp_rank, o.grp, o.hash, o.kind, o.ts, o.seq, o.pos, o.epoch,
           sum(CASE o.kind WHEN 'stored' THEN 1 ELSE -1 END) OVER w AS s
    FROM ordered o WHERE o.kind <> 'cleared'
    WINDOW w AS (PARTITION BY o.replica, o.dp_rank, o.grp, o.hash, o.epoch ORDER BY o.seq, o.pos)
), counted AS (
    SELECT *, s - least(0, min(s) OVER w) AS copies,
           lead(ts) OVER w AS t_next
    FROM hashed
    WINDOW w AS (PARTITION BY replica, dp_rank, grp, hash, epoch ORDER BY seq, pos)
)
SELECT c.replica, c.dp_rank, c.grp, c.hash, c.kind, c.ts AS t_from,
       coalesce(c.t_next, k.t_clear, m.t_end) AS t_to, c.copies,
       c.kind = 'stored' AS as_set
FROM counted c CROSS JOIN fleet_meta m
LEFT JOIN clears k ON k.replica = c.replica AND k.dp_rank = c.dp_rank AND k.epoch = c.epoch + 1;

CREATE OR REPLACE VIEW fleet_claimed AS
SELECT replica, dp_rank, grp, hash, t_from, t_to, copies FROM fleet_claimed_steps
WHERE copies > 0 AND t_to > t_from;

-- fleet_belief: what each router's index held, (router, replica, dp_rank, tier, hash) from
-- the first dump that has it to the next dump that has it no more (the end of the run
-- after the last dump); worker ids mapped to replicas by fleet.json.
CREATE OR REPLACE TABLE fleet_belief AS
WITH times AS (
    SELECT router, t, row_number() OVER (PARTITION BY router ORDER BY t) AS k,
           lead(t, 1, (SELECT t_end FROM fleet_meta)) OVER (PARTITION BY router ORDER BY t) AS t_next
    FROM (SELECT DISTINCT router, t FROM fleet_dump_time)
), present AS (
    SELECT DISTINCT d.router, d.replica, d.dp_rank, d.tier, d.hash, s.k, s.t, s.t_next
    FROM fleet_dump d JOIN times s ON s.router = d.router AND s.t = d.t
), islands AS (
    SELECT *, k - row_number() OVER (
        PARTITION BY router, replica, dp_rank, tier, hash ORDER BY k) AS island
    FROM present
)
SELECT router, replica, dp_rank, tier, hash, min(t) AS t_from, max(t_next) AS t_to
FROM islands GROUP BY router, replica, dp_rank, tier, hash, island;

-- fleet_compare: the two sides of each comparison as intervals: `ref` the reference, `obs`
-- the side checked. Stage engine: the events folded as a set against the step log's truth,
-- per (replica, grp, hash); stage router: each router's index against the events folded as
-- a set, per (replica, dp_rank, hash), of the groups an index is fed (the full-attention
-- groups, as Dynamo indexes today; every group when none is named); stage total: each router's index against the truth,
-- per (replica, hash) (the summary's rates and staleness).
CREATE OR REPLACE TABLE fleet_compare AS
WITH raw AS (
    SELECT 'engine' AS stage, '' AS router, replica, grp AS part, hash, 'ref' AS side, t_from, t_to
    FROM fleet_truth
    UNION ALL
    SELECT 'engine', '', replica, grp, hash, 'obs', t_from, t_to
    FROM fleet_claimed_steps WHERE as_set AND t_to > t_from
    UNION ALL
    SELECT 'router', r.router, c.replica, c.dp_rank, c.hash, 'ref', c.t_from, c.t_to
    FROM fleet_claimed_steps c CROSS JOIN fleet_router r WHERE c.as_set AND c.t_to > c.t_from
      AND (c.grp IN (SELECT grp FROM fleet_group WHERE kind = 'full_attention')
           OR NOT EXISTS (SELECT 1 FROM fleet_group WHERE kind = 'full_attention'))
    UNION ALL
    SELECT 'router', router, replica, dp_rank, hash, 'obs', t_from, t_to FROM fleet_belief
    UNION ALL
    SELECT 'total', r.router, t.replica, 0, t.hash, 'ref', t.t_from, t.t_to
    FROM fleet_truth t CROSS JOIN fleet_router r
    UNION ALL
    SELECT 'total', router, replica, 0, hash, 'obs', t_from, t_to FROM fleet_belief
), snapped AS (  -- an index dumped every N steps: both sides seen at those steps only
    SELECT stage, router, replica, part, hash, side,
           CASE WHEN stage = 'engine' OR m.sample = 0 THEN t_from
                ELSE round(ceil(round(t_from / m.sample, 6)) * m.sample, 9) END AS t_from,
           CASE WHEN stage = 'engine' OR m.sample = 0 THEN t_to
                ELSE round(ceil(round(t_to / m.sample, 6)) * m.sample, 9) END AS t_to
    FROM raw CROSS JOIN fleet_meta m
)
SELECT * FROM snapped WHERE t_to > t_from;

-- fleet_mismatch: each time span where one side of a comparison holds a hash and the other
-- does not: `false` (obs holds it, ref not) or `missed` (ref holds it, obs not), merged
-- into maximal islands; `censored` when it lasts to the end of the run ("never").
CREATE OR REPLACE TABLE fleet_mismatch AS
WITH keyed AS (  -- one integer key a (stage, router, replica, part): the sorts stay narrow
    SELECT hash(stage, router, replica, part) AS k, hash, side = 'ref' AS ref, t_from, t_to
    FROM fleet_compare
), names AS (
    SELECT DISTINCT hash(stage, router, replica, part) AS k, stage, router, replica, part
    FROM fleet_compare
), delta AS (
    SELECT k, hash, t, sum(dr) AS d_ref, sum(dob) AS d_obs
    FROM (SELECT k, hash, t_from AS t, ref::INT AS dr, (NOT ref)::INT AS dob FROM keyed
          UNION ALL SELECT k, hash, t_to, -(ref::INT), -((NOT ref)::INT) FROM keyed)
    GROUP BY k, hash, t
), run AS (
    SELECT k, hash, t AS t_from, lead(t) OVER w AS t_to,
           sum(d_ref) OVER w AS n_ref, sum(d_obs) OVER w AS n_obs
    FROM delta WINDOW w AS (PARTITION BY k, hash ORDER BY t)
), seg AS (
    SELECT *, CASE WHEN n_obs > 0 AND n_ref = 0 THEN 'false'
                   WHEN n_ref > 0 AND n_obs = 0 THEN 'missed' END AS kind
    FROM run WHERE t_to > t_from
), marked AS (
    SELECT *, CASE WHEN lag(t_to) OVER w = t_from AND lag(kind) OVER w = kind
                   THEN 0 ELSE 1 END AS starts
    FROM seg WHERE kind IS NOT NULL
    WINDOW w AS (PARTITION BY k, hash ORDER BY t_from)
), grouped AS (
    SELECT *, sum(starts) OVER (PARTITION BY k, hash ORDER BY t_from) AS island FROM marked
), islands AS (
    SELECT k, hash, kind, min(t_from) AS t_from, max(t_to) AS t_to
    FROM grouped GROUP BY k, hash, kind, island
)
SELECT n.stage, n.router, n.replica, n.part, i.hash, i.kind, i.t_from, i.t_to,
       i.t_to >= (SELECT t_end FROM fleet_meta) AS censored
FROM islands i JOIN names n USING (k);

-- fleet_gap: each sequence gap of a replica's events (per rank) and its time window.
CREATE OR REPLACE TABLE fleet_gap AS
SELECT replica, dp_rank, prev_seq + 1 AS first_missing, seq - 1 AS last_missing,
       prev_ts AS t_from, ts AS t_to
FROM (SELECT replica, dp_rank, seq, ts, lag(seq) OVER w AS prev_seq, lag(ts) OVER w AS prev_ts
      FROM fleet_batch WINDOW w AS (PARTITION BY replica, dp_rank ORDER BY line))
WHERE prev_seq IS NOT NULL AND seq <> prev_seq + 1;

-- fleet_restart: a replica's truth at least halved at t (a restart: its blocks dropped at
-- once, some cached anew in the same step), and whether an AllBlocksCleared came then.
CREATE OR REPLACE TABLE fleet_restart AS
WITH d AS (
    SELECT replica, t, sum(d) AS d FROM (
        SELECT replica, t_from AS t, 1 AS d FROM fleet_truth
        UNION ALL SELECT replica, t_to, -1 FROM fleet_truth) GROUP BY ALL
), r AS (
    SELECT replica, t, d, sum(d) OVER (PARTITION BY replica ORDER BY t) AS held FROM d
)
SELECT r.replica, r.t, count(e.replica) > 0 AS cleared  -- joins, not EXISTS: Spark runs them
FROM r CROSS JOIN fleet_meta m
LEFT JOIN fleet_event e ON e.replica = r.replica AND e.kind = 'cleared' AND abs(e.ts - r.t) < 1e-9
WHERE r.d < -1 AND -2 * r.d >= r.held - r.d AND r.t < m.t_end
GROUP BY r.replica, r.t;

-- fleet_fold: per replica, whether its events' hashes and its truth's share any value
-- (none, with both non-empty: the hashes were folded differently on one side).
CREATE OR REPLACE TABLE fleet_fold AS
SELECT x.replica, s.replica IS NOT NULL AS matches, (SELECT hash_fold FROM fleet_meta) AS declared
FROM (SELECT DISTINCT replica FROM fleet_event
      INTERSECT SELECT DISTINCT replica FROM fleet_truth) x
LEFT JOIN (SELECT DISTINCT e.replica FROM fleet_event e JOIN fleet_truth t USING (replica, hash)) s
       ON s.replica = x.replica;

-- fleet_residency: each false or missed residency of stage engine (a replica's events
-- against its truth) and stage router (an event-fed router's index against the events)
-- that lasts longer than the lag tolerance (set by fleet.check as fleet_lag), with its
-- cause where one is found, and the fault: `engine` or `router` (a router's mismatch that a
-- duplicate-copy removal caused is the engine's; a sequence gap, a batch numbered, so
-- published, and lost on its way, is the router side's).
CREATE OR REPLACE TABLE fleet_residency AS
WITH orphan AS (
    -- a block behind a parent its replica no longer held is no residency (a lookup stops
    -- at its first miss): an index that dropped it with its parent (Dynamo drops a
    -- removed block's descendants) missed nothing a request would hit. A router's missed
    -- span is an orphan when a store of its block names a parent no truth interval holds
    -- then (joins, not a nested EXISTS: Spark runs them)
    SELECT DISTINCT o.stage, o.router, o.replica, o.part, o.hash, o.kind, o.t_from
    FROM (
        SELECT x.stage, x.router, x.replica, x.part, x.hash, x.kind, x.t_from
        FROM fleet_mismatch x
        JOIN fleet_event e ON e.replica = x.replica AND e.kind = 'stored' AND e.hash = x.hash
                          AND e.parent IS NOT NULL AND e.ts <= x.t_from + 1e-9
        LEFT JOIN fleet_truth t ON t.replica = x.replica AND t.hash = e.parent
                               AND t.t_from <= x.t_from + 1e-9 AND x.t_from < t.t_to
        WHERE x.stage = 'router' AND x.kind = 'missed'
        GROUP BY x.stage, x.router, x.replica, x.part, x.hash, x.kind, x.t_from,
                 e.dp_rank, e.seq, e.pos, e.parent
        HAVING count(t.hash) = 0
    ) o
), m AS (
    SELECT x.*, CASE WHEN x.stage = 'engine' THEN 0 ELSE (SELECT sample FROM fleet_meta) END AS w
    FROM fleet_mismatch x
    LEFT JOIN fleet_router r ON r.router = x.router
    LEFT JOIN orphan o ON o.stage = x.stage AND o.router = x.router AND o.replica = x.replica
                      AND o.part = x.part AND o.hash = x.hash AND o.kind = x.kind
                      AND o.t_from = x.t_from
    WHERE x.stage IN ('engine', 'router') AND NOT coalesce(r.approximate, false)
      AND x.t_to - x.t_from > (SELECT lag FROM fleet_lag) AND o.hash IS NULL
), batch_hash AS (
    SELECT e.replica, e.dp_rank, e.seq, e.hash, CASE WHEN m.sample = 0 THEN e.ts
               ELSE round(ceil(round(e.ts / m.sample, 6)) * m.sample, 9) END AS t_seen
    FROM fleet_event e CROSS JOIN fleet_meta m WHERE e.kind IN ('stored', 'removed')
), whole_batch AS (  -- a batch none of whose hashes reached the router's index
    SELECT b.replica, b.dp_rank, b.t_seen, r.router
    FROM batch_hash b JOIN fleet_router r ON NOT r.approximate
    LEFT JOIN fleet_mismatch x ON x.stage = 'router' AND x.router = r.router
         AND x.replica = b.replica AND x.part = b.dp_rank AND x.hash = b.hash
         AND x.t_from = b.t_seen
    WHERE NOT EXISTS (SELECT 1 FROM fleet_event s JOIN fleet_mismatch p
                      ON p.stage = 'router' AND p.router = r.router AND p.kind = 'missed'
                     AND p.replica = s.replica AND p.hash = s.parent
                     WHERE s.replica = b.replica AND s.seq = b.seq AND s.dp_rank = b.dp_rank
                       AND s.kind = 'stored' AND p.t_from <= b.t_seen AND b.t_seen < p.t_to)
    GROUP BY b.replica, b.dp_rank, b.seq, b.t_seen, r.router
    HAVING count(x.hash) = count(*)
), hit AS (  -- each cause's evidence a mismatch has, by its rank (joins, not EXISTS: Spark
             -- runs them); a mismatch is keyed by (stage, router, replica, part, hash, kind, t_from)
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 1 AS c
    FROM m JOIN fleet_fold f ON f.replica = m.replica AND NOT f.matches
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 2
    FROM m JOIN fleet_gap g ON g.replica = m.replica AND m.t_from BETWEEN g.t_from AND g.t_to
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 3
    FROM m JOIN fleet_restart s ON s.replica = m.replica AND s.t = m.t_from AND NOT s.cleared
    WHERE m.stage = 'engine' AND m.kind = 'false'
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 4
    FROM m JOIN fleet_event e ON e.replica = m.replica AND e.kind = 'removed' AND e.grp = m.part
                             AND e.hash = m.hash AND e.ts = m.t_from
    WHERE m.stage = 'engine' AND m.kind = 'missed'
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 5
    FROM m JOIN fleet_event e ON e.replica = m.replica AND e.dp_rank = m.part AND e.kind = 'cleared'
                             AND e.ts > m.t_from - m.w - 1e-9 AND e.ts <= m.t_from + 1e-9
    WHERE m.stage = 'router' AND m.kind = 'false'
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 6
    FROM m JOIN fleet_compare c ON c.stage = 'router' AND c.router = m.router AND c.hash = m.hash
              AND (c.part <> m.part OR c.replica <> m.replica)
              AND c.side = CASE m.kind WHEN 'false' THEN 'ref' ELSE 'obs' END
              AND c.t_from <= m.t_from AND m.t_from < c.t_to
    JOIN fleet_replica a ON a.replica = c.replica
    JOIN fleet_replica b ON b.replica = m.replica AND b.worker_id = a.worker_id
    WHERE m.stage = 'router'
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 8
    FROM m JOIN fleet_event e ON e.replica = m.replica AND e.kind = 'removed'
                             AND e.ts > m.t_from - m.w - 1e-9 AND e.ts <= m.t_from + 1e-9
    JOIN fleet_group g ON g.grp = e.grp AND g.kind = 'sliding_window'
    JOIN fleet_mismatch x ON x.stage = 'router' AND x.router = m.router
     AND x.replica = m.replica AND x.hash = e.hash AND x.kind = 'missed'
     AND x.t_from = m.t_from  -- the index dropped it, or an ancestor, then
    WHERE m.stage = 'router' AND m.kind = 'missed'
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 9
    FROM m JOIN whole_batch w ON w.replica = m.replica AND w.dp_rank = m.part
                             AND w.router = m.router AND w.t_seen = m.t_from
    WHERE m.stage = 'router'
    UNION ALL
    SELECT m.stage, m.router, m.replica, m.part, m.hash, m.kind, m.t_from, 7
    FROM m JOIN fleet_claimed_steps c ON c.replica = m.replica AND c.kind = 'removed'
              AND c.copies > 0 AND c.t_from > m.t_from - m.w - 1e-9 AND c.t_from <= m.t_from + 1e-9
    WHERE m.stage = 'router' AND m.kind = 'missed'
), first_hit AS (
    SELECT stage, router, replica, part, hash, kind, t_from, min(c) AS c,
           max(CASE WHEN c = 2 THEN 1 ELSE 0 END) = 1 AS file_gap
    FROM hit GROUP BY stage, router, replica, part, hash, kind, t_from
), caused AS (  -- the first cause found, in rank order
    SELECT m.*,
        CASE f.c WHEN 1 THEN 'hash_fold_mismatch' WHEN 2 THEN 'sequence_gap'
                 WHEN 3 THEN 'restart_without_clear' WHEN 4 THEN 'duplicate_copy_removed'
                 WHEN 5 THEN 'clear_ignored' WHEN 6 THEN 'merged_dp_ranks'
                 WHEN 7 THEN 'duplicate_copy_removed' WHEN 8 THEN 'sliding_window_as_prefix'
                 WHEN 9 THEN 'sequence_gap' END AS cause,
        coalesce(f.file_gap, false) AS file_gap
    FROM m LEFT JOIN first_hit f ON f.stage = m.stage AND f.router = m.router
         AND f.replica = m.replica AND f.part = m.part AND f.hash = m.hash AND f.kind = m.kind
         AND f.t_from = m.t_from
)
SELECT stage, router, replica, part, hash, kind, t_from, t_to, censored, cause,
       CASE WHEN cause = 'hash_fold_mismatch' THEN 'engine'  -- the publisher's fold
            WHEN cause = 'sequence_gap' THEN 'router'  -- numbered, so published: lost after
            WHEN stage = 'engine' OR cause = 'duplicate_copy_removed' THEN 'engine'
            ELSE 'router' END AS fault
FROM caused;

-- fleet_decision_truth: per decision and replica, the request's prefix in blocks the
-- replica held at the decision's time, before that instant's step (`fleet sim` routes a
-- step's arrivals before its replicas step: a block cached then is not yet held, one
-- evicted then still is); the prefix stops at the first block not held; a hybrid model's
-- is the shortest over its groups), and what a lookup would hit (cut to num_tokens - 1
-- in whole blocks, as vLLM's get_computed_blocks cuts a full hit). Only decisions whose
-- request hashes are known (decisions.jsonl's `hashes`).
CREATE OR REPLACE TABLE fleet_decision_truth AS
WITH groups AS (SELECT DISTINCT replica, grp FROM fleet_step_op
                UNION SELECT replica, 0 FROM fleet_replica),
held AS (  -- a block resident when a truth interval holds the decision's time
    SELECT d.request, d.router, g.replica, g.grp, h.pos, count(t.hash) > 0 AS resident
    FROM fleet_decision d JOIN fleet_request_hash h ON h.request = d.request
    CROSS JOIN groups g
    LEFT JOIN fleet_truth t ON t.replica = g.replica AND t.grp = g.grp AND t.hash = h.hash
                           AND t.t_from < d.t AND d.t <= t.t_to
    GROUP BY d.request, d.router, d.t, g.replica, g.grp, h.pos
), per_group AS (
    SELECT request, router, replica, grp,
           coalesce(min(pos) FILTER (WHERE NOT resident), max(pos) + 1) AS prefix
    FROM held GROUP BY ALL
)
SELECT p.request, p.router, p.replica, min(p.prefix) AS resident_blocks,
       min(p.prefix) FILTER (WHERE p.grp = (SELECT coalesce(min(grp) FILTER (
           WHERE kind = 'full_attention'), 0) FROM fleet_group)) AS full_blocks,
       least(min(p.prefix), (d.prompt_tokens - 1) // m.block_size) AS hit_blocks
FROM per_group p JOIN fleet_decision d USING (request, router) CROSS JOIN fleet_meta m
GROUP BY p.request, p.router, p.replica, d.prompt_tokens, m.block_size;

-- fleet_decision_check: per decision of a router, what it predicted on the chosen replica
-- (cut like a lookup), what a lookup there hit at decision time (the truth, else the
-- outcome of a request scheduled at once: one queued met a later cache),
-- the best true hit on any replica, and the verdicts: an over-prediction (prefix false
-- hit) and a misroute (a replica with a longer true hit; `load` choices told apart).
CREATE OR REPLACE VIEW fleet_decision_check AS
WITH d AS (
    SELECT d.*, r.approximate,
           least(coalesce(p.blocks, 0), (d.prompt_tokens - 1) // m.block_size) AS predicted,
           coalesce(p.blocks, 0) AS predicted_raw, m.block_size
    FROM fleet_decision d CROSS JOIN fleet_meta m
    JOIN fleet_router r ON r.router = d.router
    LEFT JOIN fleet_prediction p ON p.request = d.request AND p.router = d.router
                                AND p.replica = d.chosen
), best AS (
    SELECT request, router, max(hit_blocks) AS best_blocks, arg_max(replica, hit_blocks) AS best
    FROM fleet_decision_truth GROUP BY ALL
)
SELECT d.request, d.router, d.approximate, d.t, d.chosen, d.reason, d.routed, d.prompt_tokens,
       d.predicted_raw, d.predicted, d.block_size,
       coalesce(c.hit_blocks, CASE WHEN o.t <= d.t + 1e-9 THEN o.cached_tokens // d.block_size END)
           AS hit_blocks,
       c.resident_blocks, c.full_blocks, b.best, b.best_blocks,
       d.predicted > coalesce(c.hit_blocks, CASE WHEN o.t <= d.t + 1e-9
                                                 THEN o.cached_tokens // d.block_size END) AS false_hit,
       d.predicted_raw > d.predicted AND d.predicted <= coalesce(c.hit_blocks,
           CASE WHEN o.t <= d.t + 1e-9 THEN o.cached_tokens // d.block_size END) AS capped,
       b.best_blocks > c.hit_blocks AS misrouted,
       o.prompt_tokens - o.cached_tokens AS recomputed,
       (c.hit_blocks - o.cached_tokens // d.block_size) * d.block_size AS recomputed_extra
FROM d
LEFT JOIN fleet_outcome o ON o.request = d.request AND o.replica = d.chosen AND d.routed
LEFT JOIN fleet_decision_truth c ON c.request = d.request AND c.router = d.router AND c.replica = d.chosen
LEFT JOIN best b ON b.request = d.request AND b.router = d.router;

-- name: fleet_inherit_cause
-- A router's missed block stored onto a parent the index lacked then (Dynamo refuses a
-- store whose parent it never saw, and drops a removed block's descendants) takes the
-- parent's cause and fault; run until nothing changes (a chain, a link a run).
-- Plan: a join of the uncaused router spans to their store events and to the parent's
-- span open then, one UPDATE.
UPDATE fleet_residency SET cause = p.cause, fault = p.fault
FROM fleet_residency p, fleet_event e
WHERE fleet_residency.stage = 'router' AND fleet_residency.kind = 'missed'
  AND fleet_residency.cause IS NULL
  AND e.replica = fleet_residency.replica AND e.hash = fleet_residency.hash AND e.kind = 'stored'
  AND e.parent IS NOT NULL AND e.ts <= fleet_residency.t_from + 1e-9
  AND e.ts > fleet_residency.t_from - (SELECT greatest(sample, 0) FROM fleet_meta) - 1e-9
  AND (p.stage = 'engine' OR p.router = fleet_residency.router) AND p.kind = 'missed'
  AND p.replica = fleet_residency.replica AND p.hash = e.parent AND p.cause IS NOT NULL
  AND p.t_from <= fleet_residency.t_from + 1e-9 AND fleet_residency.t_from < p.t_to;

-- name: fleet_check_false_residency
-- An index (or a replica's events) claims a block past the replica dropping it, longer
-- than the lag tolerance: stage engine (events against truth) or router (index against
-- events), with the cause found and the fault.
-- Plan: a filter of fleet_residency (the interval sweep of fleet_mismatch, once).
SELECT stage, router, replica, part, hash, t_from, t_to, censored, cause, fault
FROM fleet_residency WHERE kind = 'false' ORDER BY t_from, stage, router, replica, hash;

-- name: fleet_check_missed_residency
-- A replica holds a block its events (stage engine) or a router's index (stage router) do
-- not claim, longer than the lag tolerance, with the cause found and the fault.
-- Plan: a filter of fleet_residency (the interval sweep of fleet_mismatch, once).
SELECT stage, router, replica, part, hash, t_from, t_to, censored, cause, fault
FROM fleet_residency WHERE kind = 'missed' ORDER BY t_from, stage, router, replica, hash;

-- name: fleet_check_prefix_false_hit
-- A router predicted a longer prefix on its chosen replica than a lookup there hit (the
-- prediction cut to num_tokens - 1 as vLLM cuts a full hit, so that cap alone is no
-- finding); the cause `unindexed_group` when the full-attention group held the prefix
-- but another group did not (`hybrid`: a model of several kinds of group, the request's
-- hashes unknown: the same cause, unless a residency finding explains it).
-- Plan: a filter of fleet_decision_check (decisions joined to outcomes and the truth).
SELECT request, router, t, chosen, predicted, hit_blocks,
       CASE WHEN full_blocks >= predicted AND resident_blocks < predicted
            THEN 'unindexed_group' END AS cause,
       resident_blocks IS NULL AND (SELECT count(*) FROM fleet_group
                                    WHERE kind NOT IN ('full_attention', '')) > 0 AS hybrid
FROM fleet_decision_check WHERE false_hit AND NOT approximate ORDER BY t, router, request;

-- name: fleet_check_misroute
-- A router chose a replica whose true hit is shorter than another replica's, on a choice
-- it made by prefix (a `load` choice is counted in the summary, not a finding); the cause
-- `unindexed_group` as a false hit's.
-- Plan: a filter of fleet_decision_check (the truth at decision time, per replica).
SELECT request, router, t, chosen, hit_blocks, best, best_blocks, reason,
       CASE WHEN full_blocks >= predicted AND resident_blocks < predicted
            THEN 'unindexed_group' END AS cause
FROM fleet_decision_check WHERE misrouted AND reason <> 'load' AND NOT approximate ORDER BY t, router, request;

-- name: fleet_summary
-- Per router: the false- and missed-residency rates (block-seconds of the index against
-- the truth over those held), the staleness of drops and of learning (p50, p99, max in
-- seconds; `never` the ones still open at the end), misroutes (by prefix, by load) and
-- recomputed tokens (prefill that the outcomes recomputed, and beyond the truth's hit);
-- `cause` why an approximate router's residency is off (no eviction signal: measured here,
-- never a finding).
-- Plan: aggregates over fleet_mismatch's stage total and fleet_decision_check.
WITH spans AS (
    SELECT router, sum(t_to - t_from) AS held FROM fleet_compare
    WHERE stage = 'total' AND side = 'obs' GROUP BY router
), truth AS (
    SELECT sum(t_to - t_from) AS held FROM fleet_truth
), mis AS (
    SELECT router,
        sum(t_to - t_from) FILTER (WHERE kind = 'false') AS false_s,
        sum(t_to - t_from) FILTER (WHERE kind = 'missed') AS missed_s,
        quantile_cont(t_to - t_from, 0.5) FILTER (WHERE kind = 'false') AS drop_p50,
        quantile_cont(t_to - t_from, 0.99) FILTER (WHERE kind = 'false') AS drop_p99,
        max(t_to - t_from) FILTER (WHERE kind = 'false') AS drop_max,
        count(*) FILTER (WHERE kind = 'false' AND censored) AS drop_never,
        quantile_cont(t_to - t_from, 0.5) FILTER (WHERE kind = 'missed') AS learn_p50,
        quantile_cont(t_to - t_from, 0.99) FILTER (WHERE kind = 'missed') AS learn_p99,
        max(t_to - t_from) FILTER (WHERE kind = 'missed') AS learn_max,
        count(*) FILTER (WHERE kind = 'missed' AND censored) AS learn_never
    FROM fleet_mismatch WHERE stage = 'total' GROUP BY router
), dec AS (
    SELECT d.router, count(*) AS decisions,
        count(*) FILTER (WHERE d.misrouted AND d.reason <> 'load') AS misroutes,
        count(*) FILTER (WHERE d.misrouted AND d.reason = 'load') AS load_misroutes,
        count(*) FILTER (WHERE d.false_hit) AS false_hits,
        count(*) FILTER (WHERE d.capped) AS capped_hits,
        coalesce(sum(d.recomputed), 0) AS recomputed_tokens,
        coalesce(sum(greatest(d.recomputed_extra, 0)), 0) AS recomputed_beyond_truth
    FROM (SELECT * FROM fleet_decision_check) d GROUP BY d.router
)
SELECT r.router, r.kind, r.routed,
       CASE WHEN r.approximate THEN 'no_eviction_signal' END AS cause,
       coalesce(mis.false_s, 0) / nullif(spans.held, 0) AS false_rate,
       coalesce(mis.missed_s, 0) / nullif(truth.held, 0) AS missed_rate,
       mis.drop_p50, mis.drop_p99, mis.drop_max, coalesce(mis.drop_never, 0) AS drop_never,
       mis.learn_p50, mis.learn_p99, mis.learn_max, coalesce(mis.learn_never, 0) AS learn_never,
       coalesce(dec.decisions, 0) AS decisions, coalesce(dec.misroutes, 0) AS misroutes,
       coalesce(dec.load_misroutes, 0) AS load_misroutes, coalesce(dec.false_hits, 0) AS false_hits,
       coalesce(dec.capped_hits, 0) AS capped_hits,
       coalesce(dec.recomputed_tokens, 0) AS recomputed_tokens,
       coalesce(dec.recomputed_beyond_truth, 0) AS recomputed_beyond_truth
FROM fleet_router r CROSS JOIN truth
LEFT JOIN spans USING (router) LEFT JOIN mis USING (router) LEFT JOIN dec USING (router)
ORDER BY r.router;
