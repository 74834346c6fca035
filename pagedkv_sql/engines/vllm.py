"""vLLM v1's paged KV cache (vllm/v1/core/kv_cache_manager.py, block_pool.py,
kv_cache_utils.py, v1/worker/block_table.py; checked against vLLM 0.32.0).

The scheduler side: ``KVCacheManager.coordinator.single_type_managers[g].req_to_blocks``
maps a request id to its ``KVCacheBlock`` list in KV-cache group ``g``
(``get_block_ids(request_id)``); ``block_pool.blocks[i]`` has ``block_id``, ``ref_cnt``,
``block_hash`` and ``is_null`` (block 0, the null block, whose ref_cnt vLLM does not
maintain); ``block_pool.free_block_queue`` is a doubly linked list from
``fake_free_list_head`` to ``fake_free_list_tail`` with a ``num_free_blocks`` counter.
The worker side: ``block_table`` int32 ``[max_num_reqs, max_num_blocks_per_req]`` (zeros
past ``num_blocks_per_row``) and ``slot_mapping`` int64, ``block_id * block_size + pos %
block_size`` a token, ``-1`` for padding.

A snapshot holds (row r = the r-th request, seq_id r):

- ``block_table`` int32 ``[R, M]`` (one KV-cache group) or ``[G, R, M]``;
  ``num_blocks_per_row`` int32 ``[R]`` / ``[G, R]``;
- ``num_tokens`` and ``num_computed_tokens`` int64 ``[R]`` (absent: every slot of the
  listed blocks counts as a token); ``capture`` puts vLLM's ``num_computed_tokens`` in both:
  the sampled token's KV is not written until its next step;
- ``ref_cnt`` int32 ``[num_blocks]``, ``free_block_queue`` int32 (the queue in order),
  when captured from the scheduler;
- ``slot_mapping`` int64, the worker's per-token slots, requests in row order (optional);
- meta: ``block_size``, ``request_ids``, ``num_blocks``, ``null_block`` (0),
  ``block_hashes`` (``{block_id: hex}`` of cached blocks), ``num_free_blocks`` (the
  queue's own counter), ``free_queue_complete`` (false when the walk of the linked list
  had to stop: a cycle, as a double free makes), ``request_block_hashes`` (per group, per
  row, the request's hash of each held block in the blocks' own form, or null),
  ``kv_cache_groups`` (each group's kind, block size, window and layer names:
  engines/groups.py) and ``kv_cache_coordinator`` (its class). ``block_size`` is the
  primary group's (the first full-attention group, else group 0), the group the spec's
  relations describe.

``capture`` reads attributes only; it never imports vLLM.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa

from ..errors import InputError, Problem
from ..kv_groups import CHUNKED_LOCAL, FULL_ATTENTION, MAMBA, SLIDING_WINDOW, WINDOW_KEYS
from . import groups as snapshot_groups
from .snapshot import Snapshot
from .tables import EngineState, Pool, free_queue_table, table

NAME = "vllm"
NULL_BLOCK = 0


def capture(
    kv_cache_manager: Any, requests: Iterable[Any] | Mapping[str, Any] | None = None
) -> Snapshot:
    """Snapshot a live vLLM v1 ``KVCacheManager``: every request's blocks per KV-cache
    group, every block's ref_cnt and hash, the free queue in order.

    ``requests`` (vLLM ``Request`` objects, or the scheduler's ``requests`` dict) give each
    request's ``num_tokens`` and ``num_computed_tokens``; without them a request counts
    every slot of its blocks as a token."""
    managers = list(kv_cache_manager.coordinator.single_type_managers)
    pool = kv_cache_manager.block_pool
    described = describe_groups(kv_cache_manager, managers)
    first = snapshot_groups.primary([g["kind"] for g in described])
    block_size = int(managers[first].block_size)
    # request order: as the managers hold them (insertion order), the first group's first
    request_ids = list(dict.fromkeys(str(r) for m in managers for r in m.req_to_blocks))
    groups = [[_ids(m.req_to_blocks.get(rid, ())) for rid in request_ids] for m in managers]
    width = max((len(ids) for group in groups for ids in group), default=0)
    tables = np.zeros((len(groups), len(request_ids), width), dtype=np.int32)
    per_row = np.zeros((len(groups), len(request_ids)), dtype=np.int32)
    for g, group in enumerate(groups):
        for r, ids in enumerate(group):
            tables[g, r, : len(ids)] = ids
            per_row[g, r] = len(ids)
    arrays: dict[str, Any] = {
        "block_table": tables[0] if len(groups) == 1 else tables,
        "num_blocks_per_row": per_row[0] if len(groups) == 1 else per_row,
    }
    blocks = list(pool.blocks)
    arrays["ref_cnt"] = np.array([b.ref_cnt for b in blocks], dtype=np.int32)
    queue, complete = free_queue(pool.free_block_queue, len(blocks))
    arrays["free_block_queue"] = np.array(queue, dtype=np.int32)
    meta: dict[str, Any] = {
        "block_size": block_size,
        "request_ids": request_ids,
        "num_blocks": len(blocks),
        "null_block": int(pool.null_block.block_id),
        "num_free_blocks": int(pool.free_block_queue.num_free_blocks),
        "free_queue_complete": complete,
        "num_kv_cache_groups": len(groups),
        "kv_cache_groups": described,
        "kv_cache_coordinator": type(kv_cache_manager.coordinator).__name__,
        "block_hashes": {
            str(b.block_id): _hash_text(b.block_hash) for b in blocks if b.block_hash is not None
        },
    }
    if requests is not None:
        by_id: dict[str, Any] = (
            {str(k): v for k, v in requests.items()}
            if isinstance(requests, Mapping)
            else {str(r.request_id): r for r in cast(Iterable[Any], requests)}
        )
        # The tokens whose KV is written: num_computed_tokens (the scheduler counts a
        # step's tokens when it schedules them). The sampled token is in num_tokens but
        # not computed: its slot comes with the next step's allocation, so in vLLM's
        # order (allocate, compute, sample) num_tokens can exceed the blocks held.
        written = np.array(
            [
                _count(by_id, rid, "num_computed_tokens", per_row[first, i] * block_size)
                for i, rid in enumerate(request_ids)
            ],
            dtype=np.int64,
        )
        _refuse_unheld(written, per_row[first], block_size, request_ids)
        arrays["num_tokens"] = written
        arrays["num_computed_tokens"] = written.copy()
        arrays["slot_mapping"] = slot_mapping(tables[first], written, block_size)
        meta["request_block_hashes"] = [
            [_request_hashes(by_id.get(rid), m, g, pool, int(m.block_size)) for rid in request_ids]
            for g, m in enumerate(managers)
        ]
    return Snapshot(NAME, arrays, meta, source="<vllm capture>")


def assert_consistent(
    kv_cache_manager: Any, requests: Iterable[Any] | Mapping[str, Any] | None = None
) -> None:
    """For vLLM's own tests: capture the manager (and ``requests``, as for ``capture``) and
    check every engine invariant in memory (``check_snapshot``). Raises ``AssertionError``
    naming each finding's request and block ids, or saying why the state cannot be mapped
    (a request's computed tokens beyond its blocks)."""
    from .fastcheck import assert_captured

    assert_captured("vLLM KV cache", lambda: capture(kv_cache_manager, requests))


def free_queue(queue: Any, num_blocks: int) -> tuple[list[int], bool]:
    """The free queue's block ids from head to tail, and whether the walk reached the
    tail. A double free can link the list into a cycle: the walk stops after visiting
    twice as many entries as there are blocks, keeping what it saw (duplicates show)."""
    ids: list[int] = []
    tail = queue.fake_free_list_tail
    block = queue.fake_free_list_head.next_free_block
    limit = 2 * num_blocks + 2
    while block is not None and block is not tail and len(ids) < limit:
        ids.append(int(block.block_id))
        block = block.next_free_block
    return ids, block is tail


def slot_mapping(block_table: np.ndarray, num_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """The worker's slot_mapping: block_table[r, pos // B] * B + pos % B for every token of
    every row, rows in order (int64)."""
    counts = np.asarray(num_tokens, dtype=np.int64)
    rows = np.repeat(np.arange(counts.size), counts)
    starts = np.cumsum(counts) - counts
    pos = np.arange(rows.size, dtype=np.int64) - np.repeat(starts, counts)
    blocks = np.asarray(block_table, dtype=np.int64)[rows, pos // block_size]
    return blocks * block_size + pos % block_size


def _refuse_unheld(
    written: np.ndarray, blocks: np.ndarray, block_size: int, request_ids: list[str]
) -> None:
    """A request whose computed tokens do not fit the blocks it holds cannot be mapped: an
    InputError naming each such request (never an IndexError in slot_mapping)."""
    bad = np.flatnonzero((written < 0) | (written > blocks.astype(np.int64) * block_size))
    if bad.size == 0:
        return
    problems = [
        Problem(
            "<vllm capture>",
            None,
            None,
            f"request {request_ids[i]!r}: num_computed_tokens {written[i]} but it holds "
            f"{blocks[i]} block(s) of {block_size} slots",
        )
        for i in bad[:100]
    ]
    raise InputError(
        f"cannot capture {bad.size} request(s) whose computed tokens are not in the blocks "
        f"they hold (first: {request_ids[bad[0]]!r}); nothing was captured",
        problems,
        int(bad.size),
        hint="capture between scheduler steps, where every computed token has a slot",
    )


def _request_hashes(
    request: Any, manager: Any, group: int, pool: Any, block_size: int
) -> list[str | None]:
    """The request's prefix-cache hash of each block it holds in ``group``, as the block's
    own ``block_hash`` is written (hash bytes + the group id, 4 bytes big-endian, in hex);
    None past the request's full blocks, and where the held block's hash covers no whole
    number of blocks (a partial-prefix entry: vLLM's fine-grained hits)."""
    if request is None:
        return []
    held = manager.req_to_blocks.get(str(request.request_id), ())
    hashes = list(getattr(request, "block_hashes", ()) or ())
    scale = max(1, block_size // int(getattr(pool, "hash_block_size", block_size) or block_size))
    view = hashes[scale - 1 :: scale]
    suffix = group.to_bytes(4, "big", signed=False)
    out: list[str | None] = []
    for i, block in enumerate(held):
        h = view[i] if i < len(view) else None
        tokens = getattr(block, "block_hash_num_tokens", None)
        if not isinstance(h, bytes | bytearray) or (tokens is not None and tokens % block_size):
            out.append(None)
        else:
            out.append((bytes(h) + suffix).hex())
    while out and out[-1] is None:
        out.pop()
    return out


def _ids(blocks: Iterable[Any]) -> list[int]:
    return [int(b.block_id) for b in blocks]


def _count(by_id: Mapping[str, Any], rid: str, attr: str, default: int) -> int:
    request = by_id.get(rid)
    return int(getattr(request, attr)) if request is not None else int(default)


def _hash_text(block_hash: Any) -> str:
    if isinstance(block_hash, bytes | bytearray):
        return bytes(block_hash).hex()
    return str(block_hash)


# -- import ---------------------------------------------------------------------------------
def to_state(snap: Snapshot, *, convert: bool = False) -> EngineState:
    """Check a vLLM snapshot and map it to the engine tables (docs/engines.md)."""
    snap.check_meta()
    block_size = snap.block_size
    raw = snap.integers(
        "block_table",
        ndim=snap.array("block_table").ndim,
        dtypes=("int32",),
        convert=("int64",) if convert else (),
    )
    if raw.ndim not in (2, 3):
        raise InputError(
            f"{snap.source}: array 'block_table' has shape {list(raw.shape)}; expected "
            "[num_reqs, max_num_blocks_per_req] or [num_groups, num_reqs, max_num_blocks_per_req]"
        )
    tables = raw if raw.ndim == 3 else raw[None]
    groups, rows, width = tables.shape
    counts = snap.integers("num_blocks_per_row", ndim=raw.ndim - 1, dtypes=("int32", "int64"))
    counts = counts if counts.ndim == 2 else counts[None]
    if counts.shape != (groups, rows):
        raise InputError(
            f"{snap.source}: array 'num_blocks_per_row' has shape {list(counts.shape)}; "
            f"block_table has {groups} group(s) of {rows} row(s)"
        )
    flat = counts.reshape(-1)
    snap.refuse(
        "num_blocks_per_row",
        (flat < 0) | (flat > width),
        lambda i: f"[{i}] = {flat[i]} is outside [0, {width}] (block_table's width)",
    )
    described = snapshot_groups.read(snap, groups)
    first = described.primary
    num_blocks = snap.meta.get("num_blocks")
    ids = snap.request_ids or [str(r) for r in range(rows)]
    if len(ids) != rows:
        raise InputError(
            f"{snap.source}: metadata has {len(ids)} request id(s) for {rows} block_table row(s)"
        )
    listed = np.arange(width)[None, None, :] < counts[:, :, None]
    g_idx, r_idx, b_idx = np.nonzero(listed)
    block_ids = tables[g_idx, r_idx, b_idx]
    room = counts[first].astype(np.int64) * block_size

    def fitting(name: str) -> np.ndarray:
        """A per-request token count, each inside the request's own blocks of the primary
        group (a computed count of 2^31-1 on one block, or -1, is refused by index)."""
        values = snap.counted(name, rows, "block_table row(s)")
        snap.refuse(
            name,
            (values < 0) | (values > room),
            lambda i: (
                f"[{i}] = {values[i]} does not fit request {ids[i]!r}'s "
                f"{counts[first][i]} block(s) of {block_size} tokens"
                + (f" in KV-cache group {first}" if groups > 1 else "")
            ),
        )
        return values

    num_tokens = fitting("num_tokens") if "num_tokens" in snap.arrays else room
    computed = fitting("num_computed_tokens") if "num_computed_tokens" in snap.arrays else None
    requests = table(
        "engine_request",
        seq_id=np.arange(rows, dtype=np.int64),
        request_id=ids,
        engine_row=np.arange(rows, dtype=np.int64),
        num_tokens=num_tokens,
        num_computed_tokens=computed,
    )
    block_table = table(
        "engine_block_table",
        seq_id=r_idx.astype(np.int64),
        group_id=g_idx.astype(np.int64),
        block_index=b_idx.astype(np.int64),
        pool_id=np.zeros(block_ids.size, dtype=np.int64),
        block_id=block_ids,
    )
    blocks = None
    null_block = int(snap.meta.get("null_block", NULL_BLOCK))
    if "ref_cnt" in snap.arrays:
        ref_cnt = snap.integers("ref_cnt", ndim=1, dtypes=("int32", "int64"))
        num_blocks = ref_cnt.size if num_blocks is None else int(num_blocks)
        hashes = snap.meta.get("block_hashes") or {}
        block_id = np.arange(ref_cnt.size, dtype=np.int64)
        blocks = table(
            "engine_block",
            pool_id=np.zeros(ref_cnt.size, dtype=np.int64),
            block_id=block_id,
            ref_cnt=ref_cnt,
            block_hash=_block_hashes(hashes, ref_cnt.size),
            is_null=block_id == null_block,
        )
    else:  # worker arrays only (an export): the null block is still no block
        blocks = table("engine_block", pool_id=[0], block_id=[null_block], is_null=[True])
    free = free_queue_table(snap, "free_block_queue")
    hashes_table = request_hash_table(snap, groups, ids)
    info = {}
    for key in (
        "num_free_blocks",
        "free_queue_complete",
        "num_kv_cache_groups",
        "kv_cache_coordinator",
    ):
        if key in snap.meta:
            info[f"vllm {key}"] = str(snap.meta[key])
    pool = Pool.from_tensors(0, "kv_cache", snap.cache_tensors, block_size)
    free_count = snap.meta.get("num_free_blocks")
    pool = dataclasses.replace(
        pool,
        num_blocks=pool.num_blocks if num_blocks is None else int(num_blocks),
        free_count=None if free_count is None else int(free_count),
    )
    pools = [pool]
    return EngineState(
        NAME,
        block_size,
        requests,
        block_table,
        pools,
        blocks=blocks,
        free_blocks=free,
        request_hashes=hashes_table,
        kv_groups=described.table(),
        cache_tensors=list(snap.cache_tensors),
        info=info,
    )


def _block_hashes(hashes: Mapping[str, Any], num_blocks: int) -> np.ndarray:
    """Meta ``block_hashes`` ({block id: hex}) as one value a block, None where a block has
    no hash (ids outside the blocks are ignored, as before)."""
    out = np.full(num_blocks, None, dtype=object)
    if hashes:
        keys = np.array(list(hashes), dtype=object)
        try:
            ids = keys.astype(np.int64)
        except (TypeError, ValueError):  # a key that is no block id names no block
            ids = np.array([int(k) if str(k).isdigit() else -1 for k in keys], np.int64)
        values = np.array([str(v) for v in hashes.values()], dtype=object)
        keep = (ids >= 0) & (ids < num_blocks) & (np.array([str(i) for i in ids]) == keys)
        out[ids[keep]] = values[keep]
    return out


def request_hash_table(snap: Snapshot, groups: int, ids: list[str]) -> pa.Table | None:
    """``engine_request_hash`` from meta ``request_block_hashes`` (per group, per row, the
    hex hash of each block index or null); None when the snapshot has none."""
    given = snap.meta.get("request_block_hashes")
    if given is None:
        return None
    shape_ok = isinstance(given, list) and len(given) == groups
    shape_ok = shape_ok and all(isinstance(g, list) and len(g) == len(ids) for g in given)
    if not shape_ok:
        raise InputError(
            f"{snap.source}: metadata 'request_block_hashes' is not a list of {groups} "
            f"group(s) of {len(ids)} request(s), each a list of hex hashes or null"
        )
    lists = [hashes for rows in given for hashes in rows]
    for k, hashes in enumerate(lists):
        if not isinstance(hashes, list):
            g, r = divmod(k, len(ids))
            raise InputError(
                f"{snap.source}: metadata 'request_block_hashes'[{g}][{r}] (request "
                f"{ids[r]!r}) is not a list"
            )
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    flat = np.array(list(itertools.chain.from_iterable(lists)), dtype=object)
    owner = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    index = np.arange(flat.size, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    keep = flat != None  # noqa: E711 (elementwise)
    group, seq = np.divmod(owner[keep], max(1, len(ids)))
    return table(
        "engine_request_hash",
        seq_id=seq,
        group_id=group,
        block_index=index[keep],
        block_hash=np.array([str(h) for h in flat[keep]], dtype=object),
    )


# -- KV-cache groups: the kind of each group's spec class, and the groups of a live manager
# as snapshot metadata (engines/groups.py reads them back). A spec class keeps the name of
# vLLM's KVCacheSpecKind: full_attention (FullAttentionSpec and the specs that keep every
# token like it), sliding_window (window W tokens), chunked_local_attention (chunk C
# tokens), mamba (per-request state blocks, not tokens). Any other spec class is refused by
# name, never guessed: its manager may keep tokens in a way none of these describes (vLLM's
# RSWASpec frees a gap in the middle).
# vLLM's spec classes (v1/kv_cache_interface.py) by exact class name: a subclass is a spec
# of its own, whose manager may keep tokens otherwise
SPEC_KINDS = {
    "FullAttentionSpec": FULL_ATTENTION,
    "MLAAttentionSpec": FULL_ATTENTION,
    "SinkFullAttentionSpec": FULL_ATTENTION,
    "CrossAttentionSpec": FULL_ATTENTION,
    "SlidingWindowSpec": SLIDING_WINDOW,
    "SlidingWindowMLASpec": SLIDING_WINDOW,
    "ChunkedLocalAttentionSpec": CHUNKED_LOCAL,
    "MambaSpec": MAMBA,
}
UNIFORM = "UniformTypeKVCacheSpecs"  # several layers' specs of one type, as one group's


def spec_kind(spec: Any, group: int) -> str:
    """The kind of a group's ``KVCacheSpec`` (``UniformTypeKVCacheSpecs``: its layers'
    one kind); an ``InputError`` naming the class for a spec pagedkv-sql does not model."""
    name = type(spec).__name__
    if name == UNIFORM:
        inner = {spec_kind(s, group) for s in dict(spec.kv_cache_specs).values()}
        if len(inner) == 1:
            return inner.pop()
        name = f"{UNIFORM} of {sorted(inner)}"
    elif name in SPEC_KINDS:
        return SPEC_KINDS[name]
    raise InputError(
        f"cannot capture KV-cache group {group}: its spec {name} is not one pagedkv-sql "
        f"models ({', '.join(sorted(SPEC_KINDS))}); nothing was captured",
        hint="its manager's token retention is not known here; report the spec class "
        "(https://github.com/pagedkv-sql/pagedkv-sql/issues)",
    )


def _spec_window(spec: Any, key: str) -> int | None:
    if type(spec).__name__ == UNIFORM:
        values = {_spec_window(s, key) for s in dict(spec.kv_cache_specs).values()}
        return values.pop() if len(values) == 1 else None
    value = getattr(spec, key, None)
    return None if value is None else int(value)


def describe_groups(kv_cache_manager: Any, managers: Sequence[Any]) -> list[dict[str, Any]]:
    """Each group of a live manager as snapshot metadata: kind, block_size (its manager's),
    sliding_window and attention_chunk_size (null unless its kind has one), layer_names
    (from the manager's ``kv_cache_config``, empty where it has none)."""
    config = getattr(kv_cache_manager, "kv_cache_config", None)
    specs = list(getattr(config, "kv_cache_groups", None) or [])
    out = []
    for g, manager in enumerate(managers):
        spec = manager.kv_cache_spec
        kind = spec_kind(spec, g)
        layers = [str(n) for n in specs[g].layer_names] if g < len(specs) else []
        out.append(
            {
                "kind": kind,
                "block_size": int(manager.block_size),
                WINDOW_KEYS[SLIDING_WINDOW]: _spec_window(spec, WINDOW_KEYS[SLIDING_WINDOW])
                if kind == SLIDING_WINDOW
                else None,
                WINDOW_KEYS[CHUNKED_LOCAL]: (
                    _spec_window(spec, WINDOW_KEYS[CHUNKED_LOCAL])
                    if kind == CHUNKED_LOCAL
                    else None
                ),
                "layer_names": layers,
            }
        )
    return out
