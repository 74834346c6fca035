"""TensorRT-LLM's paged KV cache (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp,
cpp/tensorrt_llm/kernels/kvCacheIndex.h).

- ``kv_cache_block_offsets`` int32 ``[num_pools, num_seqs * beam_width, 2,
  max_blocks_per_seq]`` (``host_kv_cache_block_offsets`` too): for pool p, sequence row r,
  K (0) or V (1) and block b, a ``KVCacheIndex``. Its top two bits are the pool type
  (0 primary = GPU, 1 secondary = host memory, 2 tertiary = disk; before TensorRT-LLM
  had a tertiary pool only bit 31 flagged the secondary pool: ``index_encoding``
  ``"secondary_bit31"``), the rest an index into the pool viewed as
  ``[num_blocks * num_layers * kv_factor]`` sub-blocks: ``block * num_layers * kv_factor
  + kv`` (``setOffsets``: ``flat_index3(memoryPoolBlockIndex, 0, fieldIdx, numLayers,
  kvFactor)``), or with ``layer_first`` pools ``block * kv_factor + kv``. ``-1`` (all bits
  set: ``KVCacheIndex::nullIndex``) is a placeholder: no block.
- ``sequence_length`` int32 ``[num_seqs * beam_width]``: tokens of each row; its first
  ``ceil(len / tokens_per_block)`` blocks are read.
- ``host_kv_cache_pool_pointers`` int64 ``[num_pools, 2]`` (primary, secondary), optional.
- meta: ``tokens_per_block``, ``num_layers`` (an int, or one per pool), ``kv_factor``
  (2; 1 for K-only caches), ``beam_width`` (1), ``layer_first`` (false),
  ``index_encoding`` (``"pool_type_2bit"``), ``request_ids`` (one per sequence), and, for
  byte addresses, ``num_kv_heads``, ``size_per_head``, ``dtype`` and ``num_blocks`` /
  ``num_secondary_blocks`` (one per pool); ``num_free_blocks`` (the manager's
  ``getNumFreeBlocks()``, one per pool) is checked against the blocks no row holds.

Rows map to sequences one to one (``seq_id`` = row; with beams the request id gets
``#beam{b}``); pool 0's blocks give the spec's relations, primary blocks
``block_table_entry`` and secondary blocks ``swapped_block``; other pools stay in
``engine_block_table`` (group_id = pool index). Tertiary (disk) blocks give no spec row
(the spec has no disk tier): they stay in ``engine_block_table`` in the ``disk`` pool, their
tokens are page faults, and ``diag_engine_disk_block`` names each (docs/engines.md).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..arguments import argument
from ..errors import InputError
from ..numbers import INT64_MAX
from .meta import request_ids_argument
from .snapshot import CacheTensor, Snapshot, as_numpy
from .tables import EngineState, Pool, table

NAME = "trtllm"
OFFSETS = "kv_cache_block_offsets"
ALIASES = {
    "host_kv_cache_block_offsets": OFFSETS,
    "kv_cache_pool_pointers": "host_kv_cache_pool_pointers",
}
NULL_INDEX = -1
TIERS = ("gpu", "cpu", "disk")  # pool types 0, 1, 2
ENCODINGS = {"pool_type_2bit": 30, "secondary_bit31": 31}  # shift of the pool-type bits
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1, "int8": 1}


def snapshot(
    kv_cache_block_offsets: Any,
    sequence_length: Any,
    tokens_per_block: int,
    num_layers: int | Sequence[int],
    *,
    pool_pointers: Any = None,
    request_ids: Sequence[str] | None = None,
    beam_width: int = 1,
    kv_factor: int = 2,
    **meta: Any,
) -> Snapshot:
    """A TensorRT-LLM snapshot from the arrays its runtime hands the attention kernels
    (torch or numpy) and the cache's configuration."""
    argument(tokens_per_block, "tokens_per_block", numbers.Integral, "an integer")
    argument(num_layers, "num_layers", (numbers.Integral, list, tuple), "an integer or a list")
    arrays = {
        OFFSETS: as_numpy(kv_cache_block_offsets, OFFSETS),
        "sequence_length": as_numpy(sequence_length, "sequence_length"),
    }
    if pool_pointers is not None:
        arrays["host_kv_cache_pool_pointers"] = as_numpy(pool_pointers, "pool_pointers")
    info: dict[str, Any] = {
        "tokens_per_block": int(tokens_per_block),
        "block_size": int(tokens_per_block),
        "num_layers": num_layers if isinstance(num_layers, int) else list(num_layers),
        "beam_width": beam_width,
        "kv_factor": kv_factor,
        **meta,
    }
    ids = request_ids_argument(request_ids)
    if ids is not None:
        info["request_ids"] = ids
    return Snapshot(NAME, arrays, info)


def _per_pool(snap: Snapshot, key: str, pools: int, default: Any = None) -> list[Any]:
    value = snap.meta.get(key, default)
    if value is None or isinstance(value, int):
        return [value] * pools
    if not isinstance(value, list) or len(value) != pools:
        raise InputError(f"{snap.source}: metadata '{key}' has to be one value or {pools}")
    return value


def to_state(snap: Snapshot, *, convert: bool = False) -> EngineState:
    snap.check_meta()
    for alias, name in ALIASES.items():
        if name not in snap.arrays and alias in snap.arrays:
            snap.arrays[name] = snap.arrays[alias]
    if "tokens_per_block" in snap.meta and "block_size" not in snap.meta:
        snap.meta["block_size"] = snap.meta["tokens_per_block"]
    offsets = snap.integers(
        OFFSETS, ndim=4, dtypes=("int32",), convert=("int64",) if convert else ()
    )
    lengths = snap.integers("sequence_length", ndim=1, dtypes=("int32", "int64"))
    tpb = snap.block_size
    num_pools, rows, two, max_blocks = offsets.shape
    if two != 2:
        raise InputError(
            f"{snap.source}: array '{OFFSETS}' has shape {list(offsets.shape)}; its third "
            "dimension is K/V and has 2 entries"
        )
    if lengths.size != rows:
        raise InputError(
            f"{snap.source}: array 'sequence_length' has {lengths.size} entries for "
            f"{rows} rows of {OFFSETS} (num_seqs * beam_width)"
        )
    beam = int(snap.meta.get("beam_width", 1))
    if beam < 1 or rows % beam:
        raise InputError(f"{snap.source}: {rows} rows are not num_seqs * beam_width {beam}")
    encoding = str(snap.meta.get("index_encoding", "pool_type_2bit"))
    if encoding not in ENCODINGS:
        raise InputError(
            f"{snap.source}: index_encoding '{encoding}' is not one of {', '.join(ENCODINGS)}"
        )
    kv_factor = int(snap.meta.get("kv_factor", 2))  # 1 or 2 (engines/meta.py)
    layer_first = snap.meta.get("layer_first", False) is True
    layers = [int(x) for x in _per_pool(snap, "num_layers", num_pools)]
    snap.refuse(
        "sequence_length",
        lengths < 0,
        lambda i: f"[{i}] = {lengths[i]} is negative",
    )
    blocks_needed = -(-lengths // tpb)
    snap.refuse(
        "sequence_length",
        blocks_needed > max_blocks,
        lambda i: (
            f"[{i}] = {lengths[i]} needs {blocks_needed[i]} blocks of {tpb} tokens; "
            f"{OFFSETS} has room for {max_blocks}"
        ),
    )

    # the entries in use: (pool, row, block) with block < blocks needed by the row
    pool_ix, row_ix, block_ix = np.nonzero(
        np.broadcast_to(
            np.arange(max_blocks) < blocks_needed[:, None], (num_pools, rows, max_blocks)
        )
    )
    k = offsets[pool_ix, row_ix, 0, block_ix]
    v = offsets[pool_ix, row_ix, 1, block_ix]
    shift = ENCODINGS[encoding]
    raw_k = k.astype(np.int64) & 0xFFFFFFFF
    raw_v = v.astype(np.int64) & 0xFFFFFFFF
    null = k == NULL_INDEX
    pool_type = raw_k >> shift
    index = raw_k & ((1 << shift) - 1)
    per_block = np.array([1 if layer_first else n * kv_factor for n in layers])[pool_ix]

    def where(i: int) -> str:
        return f"[{pool_ix[i]}, {row_ix[i]}, 0, {block_ix[i]}]"

    snap.refuse(
        OFFSETS,
        ~null & (pool_type > 2),
        lambda i: (
            f"{where(i)} = {k[i]}: pool type {pool_type[i]} is none of primary, secondary, tertiary"
        ),
    )
    step = np.where(layer_first, kv_factor, per_block)
    snap.refuse(
        OFFSETS,
        ~null & (index % step != 0),
        lambda i: (
            f"{where(i)} = {k[i]}: a K index is a multiple of {step[i]} "
            f"(block * {'kv_factor' if layer_first else 'num_layers * kv_factor'})"
        ),
    )
    if kv_factor == 2:
        snap.refuse(
            OFFSETS,
            np.where(null, v != NULL_INDEX, raw_v != raw_k + 1),
            lambda i: (
                f"[{pool_ix[i]}, {row_ix[i]}, 1, {block_ix[i]}] = {v[i]}: the V index "
                f"is not the K index {k[i]} + 1"
            ),
        )
    block_id = np.ma.masked_array(index // step, mask=null)
    pool_id = pool_ix * 3 + np.where(null, 0, pool_type)

    pointers = None
    if "host_kv_cache_pool_pointers" in snap.arrays:
        raw = snap.array("host_kv_cache_pool_pointers", ndim=2)
        if raw.shape != (num_pools, 2):
            raise InputError(
                f"{snap.source}: array 'host_kv_cache_pool_pointers' has shape "
                f"{list(raw.shape)}; expected [{num_pools}, 2] (primary, secondary)"
            )
        flat = raw.reshape(-1)
        if raw.dtype == np.uint64:  # a pointer past 2^63 - 1 would wrap negative as int64
            snap.refuse(
                "host_kv_cache_pool_pointers",
                flat > INT64_MAX,
                lambda i: f"[{i // 2}, {i % 2}] = {flat[i]} is past 2^63 - 1",
            )
        pointers = snap.integers("host_kv_cache_pool_pointers", ndim=2, dtypes=("int64", "uint64"))
        snap.refuse(
            "host_kv_cache_pool_pointers",
            pointers.reshape(-1) < 0,
            lambda i: f"[{i // 2}, {i % 2}] = {flat[i]} is a negative address",
        )
    pools, tensors = _pools(snap, num_pools, layers, kv_factor, tpb, layer_first, pointers)
    counts = {p.pool_id: p.num_blocks for p in pools}
    limits = np.array([counts.get(int(p)) or 2**62 for p in pool_id], dtype=np.int64)
    snap.refuse(
        OFFSETS,
        ~null & (np.asarray(block_id.data) >= limits),
        lambda i: (
            f"{where(i)} = {k[i]}: block {block_id.data[i]} is outside the pool's "
            f"{limits[i]} blocks"
        ),
    )

    names = snap.request_names(rows // beam)
    request_ids = [names[r // beam] + (f"#beam{r % beam}" if beam > 1 else "") for r in range(rows)]
    seq_ids = np.arange(rows, dtype=np.int64)
    return EngineState(
        engine=NAME,
        block_size=tpb,
        requests=table(
            "engine_request",
            seq_id=seq_ids,
            request_id=request_ids,
            engine_row=seq_ids,
            num_tokens=lengths,
        ),
        block_table=table(
            "engine_block_table",
            seq_id=row_ix,
            group_id=pool_ix,
            block_index=block_ix,
            pool_id=pool_id,
            block_id=block_id,
        ),
        pools=pools,
        cache_tensors=tensors,
        info={"index_encoding": encoding, "beam_width": str(beam)},
    )


def _pools(
    snap: Snapshot,
    num_pools: int,
    layers: list[int],
    kv_factor: int,
    tpb: int,
    layer_first: bool,
    pointers: np.ndarray | None,
) -> tuple[list[Pool], list[CacheTensor]]:
    heads = _per_pool(snap, "num_kv_heads", num_pools)
    head_dim = _per_pool(snap, "size_per_head", num_pools)
    free = _per_pool(snap, "num_free_blocks", num_pools)
    counts = {
        0: _per_pool(snap, "num_blocks", num_pools),
        1: _per_pool(snap, "num_secondary_blocks", num_pools),
        2: [None] * num_pools,
    }
    dtype = snap.meta.get("dtype")
    itemsize = _ITEMSIZE.get(str(dtype)) if dtype is not None else None
    pools: list[Pool] = []
    tensors: list[CacheTensor] = []
    for p in range(num_pools):
        for kind, tier in enumerate(TIERS):
            pool_id = p * 3 + kind
            pointer = int(pointers[p, kind]) if pointers is not None and kind < 2 else None
            pointer = pointer or None  # 0: no such pool
            block_bytes = None
            if heads[p] and head_dim[p] and itemsize:
                sub = int(heads[p]) * tpb * int(head_dim[p]) * itemsize
                block_bytes = sub * kv_factor * (1 if layer_first else layers[p])
                n = counts[kind][p]
                if pointer is not None and n is not None and tier != "disk":
                    shape = (n, layers[p], kv_factor, int(heads[p]), tpb, int(head_dim[p]))
                    tensors.append(
                        _tensor(p, pool_id, tier, pointer, shape, str(dtype), itemsize, layer_first)
                    )
            name = f"pool {p} {('primary', 'secondary', 'tertiary')[kind]}"
            count = free[p] if kind == 0 else None  # getNumFreeBlocks(): the primary pool
            pools.append(Pool(pool_id, name, tier, pointer, block_bytes, counts[kind][p], count))
    return pools, tensors


def _tensor(
    p: int,
    pool_id: int,
    tier: str,
    pointer: int,
    sizes: tuple[int, int, int, int, int, int],
    dtype: str,
    itemsize: int,
    layer_first: bool,
) -> CacheTensor:
    """The pool as TensorRT-LLM allocates it: {numBlocks, numLayers, kvFactor, H * T * D}
    ({numLayers, numBlocks, ...} when layer-first), each block [H, T, D]."""
    blocks, layers, kv_factor, heads, tpb, head_dim = sizes
    if layer_first:
        shape = (layers, blocks, kv_factor, heads, tpb, head_dim)
        dims = ("layer", "block", "kv", "head", "slot", "dim")
    else:
        shape = (blocks, layers, kv_factor, heads, tpb, head_dim)
        dims = ("block", "layer", "kv", "head", "slot", "dim")
    strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    kv = 0 if kv_factor == 1 else None  # a K-only cache's one field is K
    name = f"pool {p} {tier}"
    return CacheTensor(name, shape, strides, dtype, itemsize, dims, pointer, kv, None, pool_id)
