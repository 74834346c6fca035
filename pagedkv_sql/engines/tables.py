"""An engine's state as relations: the engine_* tables of sql/engines.sql, and the spec's
four relations derived from them, written in one transaction (all or nothing).

Engine modules turn a snapshot into an ``EngineState`` (Arrow tables with the engine
tables' columns); ``write`` stores it. The mapping decisions live in the engine_to_*
statements of sql/engines.sql and in ``Pool.addressing`` (docs/engines.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import kv_groups
from ..check import CheckResult, diagnose, staged_violations
from ..dbutil import rollback, run, scalar
from ..errors import ConstraintError, InputError, PagedKVError
from ..numbers import INT64_MAX, INT64_MIN
from ..relations import INPUT_RELATIONS, arrow_schema
from ..sqlfiles import statements_in
from .snapshot import CacheTensor, Snapshot

SQL_FILE = "engines.sql"
ALIGN = 256
# derived relations a spec constraint can refuse: block_table_entry (an engine's negative
# ref_cnt, a misaligned base). virtual_token's offsets are pos % B or slot % B with
# B <= 256, always in [0, 255].
CHECKED = ("block_table_entry",)
NO_POINTER_SPACING = 1 << 40  # pools without a pointer: pool i's blocks start at i * 2^40

_I64 = pa.int64()
SCHEMAS: dict[str, pa.Schema] = {
    "engine_request": pa.schema(
        [
            ("seq_id", _I64),
            ("request_id", pa.string()),
            ("engine_row", _I64),
            ("num_tokens", _I64),
            ("num_computed_tokens", _I64),
        ]
    ),
    "engine_block_table": pa.schema(
        [
            ("seq_id", _I64),
            ("group_id", _I64),
            ("block_index", _I64),
            ("pool_id", _I64),
            ("block_id", _I64),
        ]
    ),
    "engine_block": pa.schema(
        [
            ("pool_id", _I64),
            ("block_id", _I64),
            ("ref_cnt", _I64),
            ("block_hash", pa.string()),
            ("lock_ref", _I64),
            ("is_null", pa.bool_()),
        ]
    ),
    "engine_free_block": pa.schema([("pool_id", _I64), ("position", _I64), ("block_id", _I64)]),
    "engine_token_slot": pa.schema([("seq_id", _I64), ("token_pos", _I64), ("slot", _I64)]),
    "engine_csr_row": pa.schema(
        [
            ("seq_id", _I64),
            ("indptr_begin", _I64),
            ("indptr_end", _I64),
            ("last_page_len", _I64),
        ]
    ),
    "engine_request_hash": pa.schema(
        [("seq_id", _I64), ("group_id", _I64), ("block_index", _I64), ("block_hash", pa.string())]
    ),
    "engine_kv_group": pa.schema(
        [
            ("group_id", _I64),
            ("kind", pa.string()),
            ("block_size", _I64),
            ("window_tokens", _I64),
            ("layers", pa.list_(pa.string())),
            ("is_primary", pa.bool_()),
        ]
    ),
}
ENGINE_TABLES = (
    "engine_info",
    "engine_request",
    "engine_pool",
    "engine_block_table",
    "engine_block",
    "engine_free_block",
    "engine_token_slot",
    "engine_cache_tensor",
    "engine_csr_row",
    "engine_request_hash",
    "engine_kv_group",
)


def table(name: str, **columns: Any) -> pa.Table:
    """An engine table from numpy arrays (or lists) by column name; columns left out are
    null. Integer arrays become int64 without a trip through Python objects; a numpy
    masked array gives nulls where it is masked."""
    schema = SCHEMAS[name]
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise ValueError(f"{name} has no column(s) {sorted(unknown)}")
    length = None
    arrays: list[pa.Array | None] = []
    for f in schema:
        value = columns.get(f.name)
        if value is None:
            arrays.append(None)
            continue
        array = _arrow(value, f.type)
        length = len(array) if length is None else length
        if len(array) != length:
            raise ValueError(f"{name}.{f.name} has {len(array)} values, not {length}")
        arrays.append(array)
    n = length or 0
    return pa.Table.from_arrays(
        [a if a is not None else pa.nulls(n, f.type) for a, f in zip(arrays, schema, strict=True)],
        schema=schema,
    )


def free_queue_table(
    snap: Snapshot, name: str, dtypes: tuple[str, ...] = ("int32", "int64")
) -> pa.Table | None:
    """``engine_free_block`` from the snapshot's 1-D array ``name``: pool 0's free queue
    (or free list) in order; None when the snapshot has no such array."""
    if name not in snap.arrays:
        return None
    queue = snap.integers(name, ndim=1, dtypes=dtypes)
    return table(
        "engine_free_block",
        pool_id=np.zeros(queue.size, dtype=np.int64),
        position=np.arange(queue.size, dtype=np.int64),
        block_id=queue,
    )


def _arrow(value: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return value.cast(type_)
    if isinstance(value, np.ma.MaskedArray):
        data = np.asarray(value.data)
        if type_ == _I64:
            data = data.astype(np.int64, copy=False)
        return pa.array(data, type_, mask=np.ma.getmaskarray(value))
    if isinstance(value, np.ndarray) and type_ == _I64:
        return pa.array(value.astype(np.int64, copy=False), type_)
    return pa.array(value, type_)


@dataclass(frozen=True)
class Pool:
    """A memory pool of equal blocks. ``block_bytes``: bytes from one block to the next
    (the block dimension's stride times the itemsize), when known."""

    pool_id: int
    name: str
    tier: str = "gpu"  # "gpu" -> block_table_entry, "cpu" -> swapped_block
    pointer: int | None = None
    block_bytes: int | None = None
    num_blocks: int | None = None
    free_count: int | None = None  # the allocator's own count of free blocks

    @classmethod
    def from_tensors(
        cls,
        pool_id: int,
        name: str,
        tensors: list[CacheTensor],
        block_size: int,
        tier: str = "gpu",
    ) -> Pool:
        """A pool described by its first cache tensor (lowest layer, K before V): the
        pointer, bytes from one block to the next, and the number of blocks."""
        mine = [t for t in tensors if t.pool == pool_id]
        if not mine:
            return cls(pool_id, name, tier)
        first = min(mine, key=lambda t: (t.layer or 0, t.kv or 0))
        if "block" in first.dims:
            i = first.dims.index("block")
            step, count = first.strides[i] * first.itemsize, first.shape[i]
        elif "token" in first.dims:
            i = first.dims.index("token")
            step = first.strides[i] * first.itemsize * block_size
            count = first.shape[i] // block_size
        else:
            return cls(pool_id, name, tier, first.pointer)
        return cls(pool_id, name, tier, first.pointer, step, count)

    def addressing(self, index: int) -> tuple[int, int, str]:
        """(base, block_step, rule): a block's address in the spec's relations is
        base + block_id * block_step, 256-aligned as the spec requires."""
        pointer, step = self.pointer, self.block_bytes
        if pointer is not None and step is not None and pointer % ALIGN == step % ALIGN == 0:
            return pointer, step, "pointer + block_id * block_bytes"
        base = index * NO_POINTER_SPACING
        if self.block_bytes is not None:
            step = -(-self.block_bytes // ALIGN) * ALIGN
            return base, step, f"{base} + block_id * {step} (block_bytes rounded up to 256)"
        return base, ALIGN, f"{base} + block_id * 256 (no layout recorded)"


@dataclass
class EngineState:
    """One engine's state, ready to store: the engine tables as Arrow."""

    engine: str
    block_size: int
    requests: pa.Table
    block_table: pa.Table
    pools: list[Pool] = field(default_factory=lambda: [Pool(0, "kv_cache")])
    blocks: pa.Table | None = None
    free_blocks: pa.Table | None = None
    token_slots: pa.Table | None = None
    csr_rows: pa.Table | None = None
    request_hashes: pa.Table | None = None  # engine_request_hash (vLLM's block hashes)
    kv_groups: pa.Table | None = None  # engine_kv_group (vLLM's KV-cache groups)
    cache_tensors: list[CacheTensor] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportReport:
    engine: str
    source: str
    rows: dict[str, int]  # relation or engine table -> rows stored
    warnings: list[CheckResult] = field(default_factory=list)


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """The engine tables (idempotent). Views are created by ``create_views``."""
    for stmt in statements_in(SQL_FILE):
        if stmt.name.startswith("create_"):
            run(con, stmt.sql)


# the views and macros ``create_views`` creates; engine_alias_*: a renamed check's old name
_VIEW_PREFIXES = ("diag_engine_", "engine_alias_", "engine_view_", "macro_engine_")


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """The engine invariants (diag_engine_*) and helper views and macros, each view with
    its one-line doc as its comment, so that `check` finds and explains it. Skipped when
    this database already has this version's views (the stamp on ``engine_findings``, the
    last one created, is a digest of their text): a repeated import creates none."""
    stamp = _views_stamp()
    have = run(
        con,
        "SELECT comment FROM duckdb_views() WHERE view_name = 'engine_findings' AND NOT temporary",
    )
    if have and have[0][0] == stamp:
        return
    kv_groups.create_macros(con)  # pagedkv_kept_start, which the views call
    for stmt in statements_in(SQL_FILE):
        if stmt.name.startswith(_VIEW_PREFIXES):
            run(con, stmt.sql)
            if stmt.name.startswith("diag_engine_"):
                doc = stmt.doc.replace("'", "''")
                run(con, f"COMMENT ON VIEW {stmt.name} IS '{doc}'")
    run(con, f"COMMENT ON VIEW engine_findings IS '{stamp}'")


@cache
def _views_stamp() -> str:
    text = "\n".join(
        [kv_groups.macros_text()]
        + [s.sql for s in statements_in(SQL_FILE) if s.name.startswith(_VIEW_PREFIXES)]
    )
    return "pagedkv-sql engine views " + hashlib.sha256(text.encode()).hexdigest()[:16]


def query(name: str) -> str:
    for stmt in statements_in(SQL_FILE):
        if stmt.name == name:
            return stmt.sql
    raise PagedKVError(f"unknown statement {name} in {SQL_FILE}")


def write(
    con: duckdb.DuckDBPyConnection,
    state: EngineState,
    source: str,
    *,
    strict: bool = False,
    diagnostics: bool = True,
) -> ImportReport:
    """Replace the spec's relations and the engine tables with ``state``, in one
    transaction: a refusal (a spec constraint, or a warning under ``strict``) leaves the
    database as it was."""
    create_schema(con)
    run(con, "BEGIN")
    try:
        rows = write_engine_tables(con, state, source)
        create_views(con)  # the derivations read its macros (the primary group, kept spans)
        rows.update(_derive(con, state, source))
        warnings = diagnose(con, diagnostics=diagnostics, strict=strict, what="import")
        run(con, "COMMIT")
    except BaseException:
        rollback(con)
        raise
    return ImportReport(state.engine, source, rows, warnings)


def _pools_fit(state: EngineState, source: str) -> None:
    """No pool claims more token slots than a real engine holds (limits.MAX_POOL_TOKENS):
    the engine checks range over a pool's blocks, so a vLLM `num_blocks` or SGLang
    `num_pages` of 2^31 - 1 in a tiny snapshot hung the import's diagnostics for minutes."""
    from ..limits import MAX_POOL_TOKENS

    for pool in state.pools:
        if pool.num_blocks is not None and pool.num_blocks * state.block_size > MAX_POOL_TOKENS:
            raise InputError(
                f"{source}: pool {pool.pool_id} ({pool.name}) of {pool.num_blocks:,} blocks x "
                f"{state.block_size} tokens is more than the {MAX_POOL_TOKENS:,} token slots a "
                "real engine holds; nothing was loaded",
                hint="the pool's size comes from the metadata (num_blocks, num_pages) or "
                "the cache tensor's shape",
            )


def _addresses_fit(state: EngineState, source: str) -> None:
    """Every block's address (pool base + block_id * block_step) fits a signed 64-bit
    integer: else an InputError naming the pool and the block, before DuckDB would stop at
    an "Overflow in multiplication"."""
    table = state.block_table
    for index, pool in enumerate(state.pools):
        mine = table.filter(pc.equal(table.column("pool_id"), pool.pool_id)).column("block_id")
        span = pc.min_max(mine).as_py()
        if span["min"] is None:
            continue
        base, step, rule = pool.addressing(index)
        low, top = span["min"], span["max"]
        for block in (low, top):
            if INT64_MIN <= base + block * step <= INT64_MAX:
                continue
            raise InputError(
                f"{source}: block {block} of pool {pool.pool_id} ({pool.name}) has no address: "
                f"{rule} = {base + block * step:,} does not fit 64 bits; nothing was imported",
                hint="the recorded pointer, layout (block_bytes) or block id is impossible",
            )


def write_engine_tables(
    con: duckdb.DuckDBPyConnection, state: EngineState, source: str
) -> dict[str, int]:
    """Replace the engine tables (and the block size setting the views read) with
    ``state``'s, deriving nothing: what the diag_engine_* views need (``write`` does this
    and derives the spec's relations, in a transaction)."""
    _pools_fit(state, source)
    _addresses_fit(state, source)
    for name in ENGINE_TABLES:
        run(con, f"DELETE FROM {name}")
    info = {
        "engine": state.engine,
        "source": source,
        "block_size": str(state.block_size),
        **state.info,
    }
    if state.free_blocks is not None:
        info["free_queue"] = "recorded"
    pool_rows = []
    for index, pool in enumerate(state.pools):
        base, step, rule = pool.addressing(index)
        info[f"pool {pool.pool_id} addresses"] = rule
        pool_rows.append(
            (
                pool.pool_id,
                pool.name,
                pool.tier,
                pool.pointer,
                pool.block_bytes,
                pool.num_blocks,
                base,
                step,
                pool.free_count,
            )
        )
    con.executemany("INSERT INTO engine_info VALUES (?, ?)", list(info.items()))
    if pool_rows:
        con.executemany("INSERT INTO engine_pool VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", pool_rows)
    tensors = [
        (
            t.name,
            t.pool,
            t.layer,
            t.kv,
            t.pointer,
            t.dtype,
            t.itemsize,
            list(t.shape),
            list(t.strides),
            list(t.dims),
        )
        for t in state.cache_tensors
    ]
    if tensors:
        con.executemany(
            "INSERT INTO engine_cache_tensor VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", tensors
        )
    arrow = {
        "engine_request": state.requests,
        "engine_block_table": state.block_table,
        "engine_block": state.blocks,
        "engine_free_block": state.free_blocks,
        "engine_token_slot": state.token_slots,
        "engine_csr_row": state.csr_rows,
        "engine_request_hash": state.request_hashes,
        "engine_kv_group": state.kv_groups,
    }
    rows: dict[str, int] = {}
    for name, data in arrow.items():
        if data is not None and data.num_rows:
            con.register("_pagedkv_engine_arrow", data)
            try:
                run(con, f"INSERT INTO {name} SELECT * FROM _pagedkv_engine_arrow")
            finally:
                con.unregister("_pagedkv_engine_arrow")
        rows[name] = 0 if data is None else data.num_rows
    run(con, "UPDATE pagedkv_settings SET value = ? WHERE name = 'block_size'", [state.block_size])
    return rows


def _derive(con: duckdb.DuckDBPyConnection, state: EngineState, source: str) -> dict[str, int]:
    """The spec's four relations from the engine tables; a spec constraint refuses."""
    rows: dict[str, int] = {}
    for relation in INPUT_RELATIONS:
        sql = query(f"engine_to_{relation}")
        params = [state.block_size] if relation == "virtual_token" else []
        run(con, f"DELETE FROM {relation}")
        if relation in CHECKED:
            # stage first, so that every offending row can be named before anything is
            # refused (a failed INSERT would abort the transaction)
            stage = f"_pagedkv_stage_{relation}"
            run(con, f"CREATE OR REPLACE TEMP TABLE {stage} AS {sql}", params)
            total, found = staged_violations(con, relation, stage, 100, lambda keys: {})
            if total:
                raise ConstraintError(
                    f"{total} row(s) of {relation} derived from {source} violate the spec's "
                    "integrity constraints; nothing was imported",
                    found,
                    total,
                    hint="the engine's own state breaks the spec (the mapping: https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/engines.md)",
                )
            sql, params = f"SELECT * FROM {stage}", []
        rows[relation] = int(scalar(con, f"INSERT INTO {relation} {sql}", params))
        if relation in CHECKED:
            run(con, f"DROP TABLE _pagedkv_stage_{relation}")
    return rows


def spec_tables(con: duckdb.DuckDBPyConnection) -> dict[str, pa.Table]:
    """The stored spec relations as Arrow tables (for export)."""
    return {
        r: con.sql(f"SELECT * FROM {r}").to_arrow_table().cast(arrow_schema(r))
        for r in INPUT_RELATIONS
    }


def has_engine_tables(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(
        scalar(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'engine_request'")
    )
