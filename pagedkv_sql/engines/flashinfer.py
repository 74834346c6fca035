"""FlashInfer's paged KV cache: a CSR page table (include/flashinfer/page.cuh,
docs/tutorials/kv_layout.rst).

- ``kv_indptr`` int32 [batch + 1]: sequence i's pages are ``kv_indices[kv_indptr[i] :
  kv_indptr[i + 1]]``, starting at 0;
- ``kv_indices`` int32 [kv_indptr[-1]]: page ids (a longer, preallocated buffer is fine:
  the tail is ignored);
- ``kv_last_page_len`` int32 [batch]: tokens in each sequence's last page, 1..page_size;
- ``page_size``: tokens a page. Sequence i holds
  ``(kv_indptr[i+1] - kv_indptr[i] - 1) * page_size + kv_last_page_len[i]`` tokens.

FlashInfer computes wrong results from int64 index arrays (its issue #725): import refuses
them unless asked to convert, and export always writes int32. The KV data is one tensor a
layer, ``[num_pages, 2, page_size, H, D]`` (NHD) or ``[num_pages, 2, H, page_size, D]``
(HND), or a (k_cache, v_cache) pair of ``[num_pages, page_size, H, D]`` /
``[num_pages, H, page_size, D]``. FlashInfer needs a GPU; ``snapshot`` takes the arrays
as FlashInfer's ``plan()`` does (torch on the GPU or the host, or numpy: a GPU array is
copied to the host once) and records the cache tensors' layouts, reading attributes only.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..arguments import argument
from ..errors import InputError, UsageError
from ..limits import MAX_POOL_TOKENS
from .meta import request_ids_argument
from .snapshot import CacheTensor, Snapshot, as_numpy
from .tables import EngineState, Pool, table

NAME = "flashinfer"
ARRAYS = ("kv_indptr", "kv_indices", "kv_last_page_len")
# FlashInfer's own alternative spellings (paged_kv_* in the wrappers' run() / prefill)
ALIASES = {f"paged_{a}": a for a in ARRAYS}
LAYOUTS = ("NHD", "HND")
_INT64_WHY = " (FlashInfer gives wrong results on int64 index arrays: its issue #725)"
_INT64_HINT = (
    "convert them with `pagedkv-sql import flashinfer PATH --convert` (values "
    "must fit int32), or cast to int32 before saving"
)


def snapshot(
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_len: Any,
    page_size: int,
    *,
    paged_kv_cache: Any = None,
    layers: Sequence[Any] | None = None,
    kv_layout: str = "NHD",
    request_ids: Sequence[str] | None = None,
) -> Snapshot:
    """A FlashInfer snapshot from the arrays given to its wrappers' ``plan()`` (torch or
    numpy), and optionally the KV cache of one layer (``paged_kv_cache``: a 5-D tensor or
    a (k_cache, v_cache) pair) or of every layer (``layers``), whose layouts are recorded
    for byte addresses."""
    argument(page_size, "page_size", numbers.Integral, "an integer (tokens a page)")
    if kv_layout not in LAYOUTS:
        raise UsageError(f"kv_layout {kv_layout!r} is not one of {', '.join(LAYOUTS)}")
    meta: dict[str, Any] = {"page_size": int(page_size), "kv_layout": kv_layout}
    ids = request_ids_argument(request_ids)
    if ids is not None:
        meta["request_ids"] = ids
    tensors: list[CacheTensor] = []
    if paged_kv_cache is not None:
        tensors += cache_tensors(paged_kv_cache, kv_layout)
    for layer, cache in enumerate(layers or ()):
        tensors += cache_tensors(cache, kv_layout, layer=layer)
    arrays = {
        "kv_indptr": as_numpy(kv_indptr, "kv_indptr"),
        "kv_indices": as_numpy(kv_indices, "kv_indices"),
        "kv_last_page_len": as_numpy(kv_last_page_len, "kv_last_page_len"),
    }
    return Snapshot(NAME, arrays, meta, tensors)


def capture(
    wrapper: Any,
    page_size: int,
    *,
    batch_size: int | None = None,
    paged_kv_cache: Any = None,
    layers: Sequence[Any] | None = None,
    request_ids: Sequence[str] | None = None,
) -> Snapshot:
    """Snapshot the page table a FlashInfer wrapper was planned with
    (``BatchDecodeWithPagedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper``...):
    its ``_paged_kv_indptr_buf``, ``_paged_kv_indices_buf`` and
    ``_paged_kv_last_page_len_buf`` (flashinfer/decode.py, prefill.py: private attributes,
    set by ``plan()``), its ``_kv_layout``, and the KV cache if given. Reads attributes
    only; the batch's part of each GPU buffer is copied to the host once. With CUDA graphs
    the buffers are preallocated for the largest batch: the batch is ``batch_size``, else
    the wrapper's ``_fixed_batch_size``, else the whole buffer."""
    indptr = wrapper._paged_kv_indptr_buf
    indices = wrapper._paged_kv_indices_buf
    last = wrapper._paged_kv_last_page_len_buf
    batch = batch_size or int(getattr(wrapper, "_fixed_batch_size", 0) or 0) or len(indptr) - 1
    return snapshot(
        indptr[: batch + 1],
        indices,
        last[:batch],
        page_size,
        paged_kv_cache=paged_kv_cache,
        layers=layers,
        kv_layout=str(getattr(wrapper, "_kv_layout", "NHD")),
        request_ids=request_ids,
    )


def cache_tensors(cache: Any, kv_layout: str, layer: int | None = None) -> list[CacheTensor]:
    """The layouts of one layer's paged KV cache, by FlashInfer's shape conventions."""
    suffix = "" if layer is None else f".{layer}"
    if isinstance(cache, tuple | list):
        if len(cache) != 2:
            raise UsageError("a FlashInfer (k_cache, v_cache) pair has two tensors")
        dims: tuple[str, ...] = (
            ("block", "slot", "head", "dim")
            if kv_layout == "NHD"
            else ("block", "head", "slot", "dim")
        )
        return [
            CacheTensor.of(f"{kv}_cache{suffix}", t, dims, kv=i, layer=layer)
            for i, (kv, t) in enumerate(zip("kv", cache, strict=True))
        ]
    dims = (
        ("block", "kv", "slot", "head", "dim")
        if kv_layout == "NHD"
        else ("block", "kv", "head", "slot", "dim")
    )
    return [CacheTensor.of(f"paged_kv_cache{suffix}", cache, dims, layer=layer)]


def _arrays(snap: Snapshot, convert: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    for alias, name in ALIASES.items():
        if name not in snap.arrays and alias in snap.arrays:
            snap.arrays[name] = snap.arrays[alias]
    got = [
        snap.integers(
            name,
            ndim=1,
            dtypes=("int32",),
            convert=("int64",) if convert else (),
            why=_INT64_WHY if str(snap.arrays.get(name, np.empty(0)).dtype) == "int64" else "",
            hint=_INT64_HINT,
        )
        for name in ARRAYS
    ]
    return got[0], got[1], got[2]


def to_state(snap: Snapshot, *, convert: bool = False) -> EngineState:
    """Check a FlashInfer snapshot and map it to the engine tables: sequence i (seq_id i)
    holds the pages kv_indices[kv_indptr[i]:kv_indptr[i+1]] as blocks 0, 1, ..."""
    snap.check_meta()
    indptr, indices, last = _arrays(snap, convert)
    page_size = snap.block_size
    if indptr.size == 0:
        raise InputError(f"{snap.source}: array 'kv_indptr' is empty; it has batch + 1 entries")
    batch = indptr.size - 1
    if last.size != batch:
        raise InputError(
            f"{snap.source}: array 'kv_last_page_len' has {last.size} entries but kv_indptr "
            f"describes {batch} sequence(s) (kv_indptr has batch + 1 = {indptr.size} entries)"
        )
    if convert:
        for name, arr in zip(ARRAYS, (indptr, indices, last), strict=True):
            snap.refuse(
                name,
                (arr > np.iinfo(np.int32).max) | (arr < np.iinfo(np.int32).min),
                lambda i, a=arr: f"[{i}] = {a[i]} does not fit int32",
            )
    n = indices.size
    snap.refuse(
        "kv_indptr",
        (indptr < 0) | (indptr > n),
        lambda i: f"[{i}] = {indptr[i]} is outside [0, {n}] (kv_indices has {n} entries)",
        hint="kv_indptr indexes kv_indices: every entry is in [0, len(kv_indices)]",
    )
    tensors = snap.cache_tensors
    pool = Pool.from_tensors(0, "paged_kv_cache", tensors, page_size)
    num_pages = snap.meta.get("num_pages", pool.num_blocks)
    if pool.num_blocks is not None and num_pages is not None and num_pages > pool.num_blocks:
        raise InputError(
            f"{snap.source}: metadata num_pages {num_pages} is more than the "
            f"{pool.num_blocks} pages of the recorded cache tensor"
        )
    begins, ends = indptr[:-1], indptr[1:]
    pages = np.maximum(ends - begins, 0)
    used = np.zeros(n, dtype=bool)
    total = int(pages.sum())
    seq = np.repeat(np.arange(batch, dtype=np.int64), pages)
    starts = np.cumsum(pages) - pages
    block_index = np.arange(total, dtype=np.int64) - np.repeat(starts, pages)
    position = np.repeat(begins, pages) + block_index
    used[position] = True
    limit = f"the pool's {num_pages} pages" if num_pages is not None else "page ids >= 0"
    snap.refuse(
        "kv_indices",
        used & ((indices < 0) | (indices >= (num_pages if num_pages is not None else 2**62))),
        lambda i: f"[{i}] = {indices[i]} is outside {limit}",
        hint="page ids index the KV cache's first dimension",
    )
    block_id = indices[position]
    num_tokens = np.where(pages > 0, np.maximum((pages - 1) * page_size + last, 0), 0)
    _bound_tokens(snap, num_tokens, pages, page_size, num_pages, indices[used])
    seq_ids = np.arange(batch, dtype=np.int64)
    return EngineState(
        engine=NAME,
        block_size=page_size,
        requests=table(
            "engine_request",
            seq_id=seq_ids,
            request_id=snap.request_names(batch),
            engine_row=seq_ids,
            num_tokens=num_tokens,
        ),
        block_table=table(
            "engine_block_table",
            seq_id=seq,
            group_id=np.zeros(total, dtype=np.int64),
            block_index=block_index,
            pool_id=np.zeros(total, dtype=np.int64),
            block_id=block_id,
        ),
        pools=[pool],
        cache_tensors=tensors,
        csr_rows=table(
            "engine_csr_row",
            seq_id=seq_ids,
            indptr_begin=begins,
            indptr_end=ends,
            last_page_len=last,
        ),
        info={"kv_layout": str(snap.meta.get("kv_layout", "unknown"))},
    )


def _bound_tokens(
    snap: Snapshot,
    num_tokens: np.ndarray,
    pages: np.ndarray,
    page_size: int,
    num_pages: int | None,
    used_pages: np.ndarray,
) -> None:
    """Refuse, before a single token is made, a sequence holding more tokens than the whole
    pool (num_pages, else the recorded tensor's pages, else the highest page id + 1) can
    hold, and tokens past the sequences' own pages beyond one pool's worth in all: what a
    kv_last_page_len above page_size claims (diag_engine_csr_row names the smaller ones)."""
    pool = num_pages if num_pages is not None else int(used_pages.max(initial=0)) + 1
    capacity = pool * page_size
    if capacity > MAX_POOL_TOKENS:
        raise InputError(
            f"{snap.source}: a pool of {pool:,} pages x {page_size} tokens (metadata num_pages, "
            f"or the cache tensor's pages) is more than the {MAX_POOL_TOKENS:,} token slots a "
            "real engine holds; nothing was loaded"
        )
    snap.refuse(
        "kv_last_page_len",
        num_tokens > capacity,
        lambda i: (
            f"[{i}] = {snap.arrays['kv_last_page_len'][i]} makes sequence {i} hold "
            f"{num_tokens[i]:,} tokens, more than the pool's {pool:,} pages x {page_size} tokens"
        ),
        hint="a FlashInfer sequence holds (pages - 1) * page_size + kv_last_page_len tokens, "
        "kv_last_page_len in [1, page_size]",
    )
    beyond = np.cumsum(np.maximum(num_tokens - pages * page_size, 0))
    first = np.zeros(beyond.size, dtype=bool)
    first[np.flatnonzero(beyond > capacity)[:1]] = True  # the sequence that passes it
    snap.refuse(
        "kv_last_page_len",
        first,
        lambda i: (
            f"[{i}] = {snap.arrays['kv_last_page_len'][i]}: sequences 0..{i} claim "
            f"{beyond[i]:,} tokens past their own pages, more than the pool's {capacity:,} "
            "token slots"
        ),
        hint="a FlashInfer sequence holds (pages - 1) * page_size + kv_last_page_len tokens, "
        "kv_last_page_len in [1, page_size]",
    )
