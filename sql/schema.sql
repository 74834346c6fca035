-- The relations of the specification (a Soufflé Datalog program) as DuckDB tables.
-- Names and attributes are the spec's; every number is a signed 64-bit BIGINT.
-- The spec's three integrity constraints are CHECK clauses, so a bad row is refused
-- even when it is inserted from the DuckDB shell.

-- name: create_root_table
-- Sequence metadata: maps a sequence to its block table.
CREATE TABLE IF NOT EXISTS root_table (
    seq_id          BIGINT NOT NULL,
    block_table_ptr BIGINT NOT NULL
);

-- name: create_block_table_entry
-- Block table: a logical block's GPU base address and its refcount (prefix sharing).
-- Spec: ":- block_table_entry(_, _, Base, _), Base mod 256 != 0." and
--       ":- block_table_entry(_, _, _, Refcount), Refcount < 0."
CREATE TABLE IF NOT EXISTS block_table_entry (
    block_table_id      BIGINT NOT NULL,
    block_index         BIGINT NOT NULL,
    physical_block_base BIGINT NOT NULL CHECK (physical_block_base % 256 = 0),
    refcount            BIGINT NOT NULL CHECK (refcount >= 0)
);

-- name: create_virtual_token
-- Token position decomposition: a token position as (block index, offset in block).
-- Spec: ":- virtual_token(_, _, _, Offset), Offset < 0 or Offset >= 256."
CREATE TABLE IF NOT EXISTS virtual_token (
    seq_id          BIGINT NOT NULL,
    token_pos       BIGINT NOT NULL,
    block_index     BIGINT NOT NULL,
    offset_in_block BIGINT NOT NULL CHECK (offset_in_block >= 0 AND offset_in_block < 256)
);

-- name: create_swapped_block
-- Swapped blocks: logical blocks held in CPU memory under GPU memory pressure.
CREATE TABLE IF NOT EXISTS swapped_block (
    block_table_id   BIGINT NOT NULL,
    block_index      BIGINT NOT NULL,
    cpu_base_address BIGINT NOT NULL
);

-- name: create_settings
-- Settings stored with the database (schema_version, block_size in tokens). A block
-- holds 1 to 256 tokens: the spec's offsets are in [0, 255].
CREATE TABLE IF NOT EXISTS pagedkv_settings (
    name  VARCHAR PRIMARY KEY,
    value BIGINT NOT NULL CHECK (name <> 'block_size' OR value BETWEEN 1 AND 256)
);

-- name: default_settings
INSERT INTO pagedkv_settings VALUES ('schema_version', 1), ('block_size', 16)
ON CONFLICT DO NOTHING;

-- name: wrapping_add
-- Signed 64-bit addition that wraps around as Soufflé's does on a 64-bit build, instead
-- of raising DuckDB's overflow error. Only a CPU address within 255 of 2^63 can need it:
-- offsets are in [0, 255] and GPU bases are 256-aligned.
CREATE OR REPLACE MACRO pagedkv_wrapping_add(a, b) AS
    CASE WHEN b > 0 AND a > 9223372036854775807::BIGINT - b
         THEN (a - 9223372036854775807::BIGINT - 1) + (b - 9223372036854775807::BIGINT - 1)
         ELSE a + b END;
