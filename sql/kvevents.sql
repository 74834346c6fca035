-- Prefix-cache events: what `kv-events --db` and `watch --db` recorded, one row a
-- hash of an event (an AllBlocksCleared / created event is one row with no hash). Not part
-- of the core schema: pagedkv_sql.live.store creates it when it first writes events.
-- block_hash / parent_hash are text in engine_block.block_hash's form (bytes in hex,
-- integers in decimal), so the two join.

-- name: create_engine_kv_event
-- The table (columns: docs/replay.md, "Prefix-cache events"); appended to, never rewritten.
-- Plan: none (DDL).
CREATE TABLE IF NOT EXISTS engine_kv_event (
    source      VARCHAR NOT NULL,
    stream      VARCHAR NOT NULL,
    seq         BIGINT,
    event       BIGINT NOT NULL,
    ts          DOUBLE,
    kind        VARCHAR NOT NULL,
    block_hash  VARCHAR,
    parent_hash VARCHAR,
    medium      VARCHAR,
    group_idx   BIGINT,
    locality    VARCHAR,
    ownership   VARCHAR,
    window_size BIGINT,
    location    VARCHAR NOT NULL
);

-- name: insert_engine_kv_event
-- Append one Arrow batch of rows (registered as _pagedkv_kv_batch, same column order).
-- Plan: one scan of the Arrow batch into the table's row groups; no sort, no join.
INSERT INTO engine_kv_event SELECT * FROM _pagedkv_kv_batch;

-- name: create_engine_kv_load
-- One row a recorded stream `kv-events --db` stored: the SHA-256 of its bytes, the name it
-- was read by, the rows and events it gave. A stream whose bytes were stored already is not
-- stored again (a rerun after an interrupted or doubtful run stores nothing twice).
-- Plan: none (DDL).
CREATE TABLE IF NOT EXISTS engine_kv_load (
    sha256 VARCHAR PRIMARY KEY,
    source VARCHAR NOT NULL,
    rows   BIGINT NOT NULL,
    events BIGINT NOT NULL
);

-- name: find_engine_kv_load
-- The load of a stream with these bytes, if there was one.
-- Plan: a point lookup on the primary key.
SELECT source, rows FROM engine_kv_load WHERE sha256 = ?;

-- name: insert_engine_kv_load
-- Record a stream's load, in the transaction that stores its rows.
-- Plan: one row.
INSERT INTO engine_kv_load VALUES (?, ?, ?, ?);
