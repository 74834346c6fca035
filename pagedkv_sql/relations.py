"""The spec's relations: names, attributes, and the keys the diagnostics reason about."""

from __future__ import annotations

import difflib

import pyarrow as pa

from .errors import UsageError

# name -> attributes, in the spec's order (sql/schema.sql declares the same tables).
INPUT_RELATIONS: dict[str, tuple[str, ...]] = {
    "root_table": ("seq_id", "block_table_ptr"),
    "block_table_entry": ("block_table_id", "block_index", "physical_block_base", "refcount"),
    "virtual_token": ("seq_id", "token_pos", "block_index", "offset_in_block"),
    "swapped_block": ("block_table_id", "block_index", "cpu_base_address"),
}
OUTPUT_RELATION = "resolved_kv_address"
OUTPUT_COLUMNS = ("seq_id", "token_pos", "physical_address")

# The key of each relation: the attributes that, in a consistent KV cache, identify a row.
# When every key is unique no exact duplicate is possible, so a load can skip the hash.
KEYS: dict[str, tuple[str, ...]] = {
    "root_table": ("seq_id",),
    "block_table_entry": ("block_table_id", "block_index"),
    "virtual_token": ("seq_id", "token_pos"),
    "swapped_block": ("block_table_id", "block_index"),
}


def arrow_schema(relation: str) -> pa.Schema:
    """The fixed Arrow schema of a relation: non-nullable int64 fields."""
    columns = OUTPUT_COLUMNS if relation == OUTPUT_RELATION else INPUT_RELATIONS[relation]
    return pa.schema([pa.field(c, pa.int64(), nullable=False) for c in columns])


OUTPUT_SCHEMA = arrow_schema(OUTPUT_RELATION)


def check_relation(name: str, what: str = "relation") -> str:
    """Return ``name`` if it is an input relation, else raise with a did-you-mean."""
    if name in INPUT_RELATIONS:
        return name
    if name == OUTPUT_RELATION:
        raise UsageError(
            f"{what} '{name}' is the spec's output relation and cannot be loaded; "
            f"input relations are: {', '.join(INPUT_RELATIONS)}"
        )
    raise UsageError(f"unknown {what} '{name}'{did_you_mean(name)}")


def did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, list(INPUT_RELATIONS), cutoff=0.75)  # best first
    if close:
        return f" (did you mean '{close[0]}'?)"
    return f"; input relations are: {', '.join(INPUT_RELATIONS)}"
