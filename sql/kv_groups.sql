-- name: macro_kept_start
-- The first position a KV-cache group keeps of a request with n tokens: the group keeps
-- positions [start, n). Full attention keeps every token (0); a sliding window W the last
-- W - 1 before the next (max(0, n - W + 1), vLLM's SlidingWindowManager); chunked local
-- attention its current chunk C (n // C * C); a Mamba group no token (n: its blocks hold
-- a state, not tokens). A group of no recorded kind keeps every token; a windowed kind
-- without its window keeps none: NULL (engine_kv_group never holds one; replay names the
-- kind from the window it has). Its numpy twin is kv_groups.kept_start.
-- Plan: a CASE on each row, inlined where it is called.
CREATE OR REPLACE MACRO pagedkv_kept_start(kind, window_tokens, n) AS
    CASE WHEN kind IN ('sliding_window', 'chunked_local_attention') AND window_tokens IS NULL
              THEN NULL
         WHEN kind = 'sliding_window' THEN greatest(0, n - window_tokens + 1)
         WHEN kind = 'chunked_local_attention' THEN n // window_tokens * window_tokens
         WHEN kind = 'mamba' THEN n
         ELSE 0 END;
