"""The GPU tier's scenario, run by two drivers: FlashInfer's kernels on a CUDA device
(tests/gpu/test_engines_flashinfer_attention.py, `make test-gpu`) and, in their place, a
torch reading of the exported arrays with FlashInfer's semantics on the CPU
(tests/engines/test_flashinfer_attention.py, `make test-engines`), so that CI proves
everything but the kernel call.

One scenario a (layout, page size): an engine's KV cache with its pages in random order
(FlashInfer NHD / HND 5-D tensors, K and V as two tensors, vLLM's
``(2, num_blocks, block_size, H, D)``, SGLang's per-layer ``[slots, H, D]`` buffers), two
layers, random fp16 K and V in every page (the pages no request holds too), imported
through the public API (``pagedkv_sql.connect``, ``load_engine`` of the engine's own
snapshot, its index arrays given as live tensors, the cache tensors recorded from the
live tensors with ``CacheTensor.of``), then exported as FlashInfer arrays
(``export_arrays(db, "flashinfer")``) that drive the decode and the paged prefill
attention (a ``Kernel``). The reference is attention computed only from the bytes at the
project's addresses (``pagedkv_kv_address``), read out of the raw memory of the tensors'
allocations; a planted swap of two pages in the exported indices must be caught for
exactly the two requests it touches.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

import pagedkv_sql
from pagedkv_sql.engines import CacheTensor, Snapshot, export_arrays, flashinfer
from pagedkv_sql.engines.layout import holds

LAYOUTS = (
    "flashinfer NHD",  # [pages, 2, page_size, H, D]
    "flashinfer HND",  # [pages, 2, H, page_size, D]
    "K, V pair NHD",  # two [pages, page_size, H, D]
    "K, V pair HND",  # two [pages, H, page_size, D]
    "vllm",  # (2, num_blocks, block_size, H, D)
    "sglang",  # k_buffer[layer], v_buffer[layer]: [slots, H, D]
)
PAGE_SIZES = (1, 16, 32)
ATOL = 5e-3  # fp16 inputs and output against an fp32 reference (FlashInfer: about 1e-3)
ARRAYS = flashinfer.ARRAYS  # kv_indptr, kv_indices, kv_last_page_len


@dataclasses.dataclass(frozen=True)
class Shape:
    requests: int = 8
    max_pages: int = 24  # pages of one request, at most
    spare_pages: int = 16  # pages no request holds: what a wrong index reads
    kv_heads: int = 2
    qo_heads: int = 4  # grouped-query attention: qo head h reads kv head h // group
    head_dim: int = 64
    layers: int = 2
    max_query: int = 8  # prefill: new tokens of one request, at most
    seed: int = 0


@dataclasses.dataclass
class State:
    """An engine's KV cache and page table, live on ``device``."""

    layout: str
    page_size: int
    shape: Shape
    device: str
    request_ids: list[str]
    pages: list[np.ndarray]  # each request's pages in order: the engine's own truth
    lengths: np.ndarray  # tokens of each request
    tensors: list[list[Any]]  # per layer, the live tensors, in the order recorded
    snapshot: Snapshot
    kv_layout: str  # the layout FlashInfer is planned with

    def kernel_cache(self, layer: int) -> Any:
        """One layer's cache as FlashInfer's run() takes it."""
        t = self.tensors[layer]
        if self.layout.startswith("flashinfer"):
            return t[0]
        if self.layout == "vllm":  # the K and V halves, each [num_blocks, block_size, H, D]
            return (t[0][0], t[0][1])
        if self.layout == "sglang" and self.page_size > 1:  # a page: page_size slots
            heads, dim = t[0].shape[1:]
            return tuple(x.view(-1, self.page_size, heads, dim) for x in t)
        return (t[0], t[1])  # SGLang's own call at page size 1: [slots, H, D] as is

    def recorded(self) -> list[tuple[CacheTensor, Any]]:
        """Each recorded layout with the live tensor it was recorded from."""
        flat = [t for layer in self.tensors for t in layer]
        return list(zip(self.snapshot.cache_tensors, flat, strict=True))


def build(layout: str, page_size: int, shape: Shape, device: str) -> State:
    """A random state of ``layout``: each request's pages drawn in random order from the
    pool (page 0 stays unused where the engine reserves it: vLLM, SGLang)."""
    salt = LAYOUTS.index(layout) * 10 + PAGE_SIZES.index(page_size)
    rng = np.random.default_rng([shape.seed, salt])
    counts = rng.integers(1, shape.max_pages + 1, shape.requests)
    last = rng.integers(1, page_size + 1, shape.requests)
    lengths = (counts - 1) * page_size + last
    first = 1 if layout in ("vllm", "sglang") else 0
    num_pages = int(counts.sum()) + shape.spare_pages + first
    order = rng.permutation(np.arange(first, num_pages))
    ends = np.cumsum(counts)
    pages = [order[e - c : e].astype(np.int64) for c, e in zip(counts, ends, strict=True)]
    ids = [f"req-{i}" for i in range(shape.requests)]
    gen = torch.Generator(device=device).manual_seed(shape.seed * 1000 + salt)

    def randn(*dims: int) -> Any:
        return torch.randn(dims, generator=gen, dtype=torch.float16, device=device)

    def live(a: np.ndarray) -> Any:  # an index array as the engine holds it: on its device
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    h, d, p = shape.kv_heads, shape.head_dim, page_size
    tensors: list[list[Any]] = []
    if layout.startswith(("flashinfer", "K, V pair")):
        kv_layout = layout[-3:]
        page = (p, h, d) if kv_layout == "NHD" else (h, p, d)
        if layout.startswith("flashinfer"):
            tensors = [[randn(num_pages, 2, *page)] for _ in range(shape.layers)]
            caches: list[Any] = [t[0] for t in tensors]
        else:
            tensors = [
                [randn(num_pages, *page), randn(num_pages, *page)] for _ in range(shape.layers)
            ]
            caches = [(k, v) for k, v in tensors]
        indptr = np.r_[0, ends].astype(np.int32)
        snap = flashinfer.snapshot(
            live(indptr),
            live(np.concatenate(pages).astype(np.int32)),
            live(last.astype(np.int32)),
            page_size,
            layers=caches,
            kv_layout=kv_layout,
            request_ids=ids,
        )
    elif layout == "vllm":
        kv_layout = "NHD"
        tensors = [[randn(2, num_pages, p, h, d)] for _ in range(shape.layers)]
        table = np.zeros((shape.requests, int(counts.max())), np.int32)
        for row, own in enumerate(pages):
            table[row, : own.size] = own
        arrays = {
            "block_table": live(table),
            "num_blocks_per_row": live(counts.astype(np.int32)),
            "num_tokens": live(lengths.astype(np.int64)),
        }
        meta = {"block_size": p, "num_blocks": num_pages, "request_ids": ids}
        dims = ("kv", "block", "slot", "head", "dim")
        recorded = [
            CacheTensor.of(f"kv_cache.{n}", t[0], dims, layer=n) for n, t in enumerate(tensors)
        ]
        snap = Snapshot("vllm", arrays, meta, recorded)
    else:  # SGLang: req_to_token rows hold slots; the rows are pool rows in random places
        kv_layout = "NHD"
        tensors = [
            [randn(num_pages * p, h, d), randn(num_pages * p, h, d)] for _ in range(shape.layers)
        ]
        rtt = np.zeros((shape.requests, int(lengths.max())), np.int32)
        for row, (own, n) in enumerate(zip(pages, lengths, strict=True)):
            pos = np.arange(n)
            rtt[row, :n] = own[pos // p] * p + pos % p
        pool_rows = rng.choice(np.arange(1, 4 * shape.requests), shape.requests, replace=False)
        spare = np.setdiff1d(np.arange(1, num_pages), np.concatenate(pages))
        arrays = {
            "req_to_token": live(rtt),
            "seq_lens": live(lengths.astype(np.int64)),
            "req_pool_indices": live(pool_rows.astype(np.int64)),
            "free_pages": live(spare.astype(np.int64)),
        }
        meta = {"page_size": p, "num_pages": num_pages - 1, "request_ids": ids}
        dims = ("token", "head", "dim")
        recorded = [
            CacheTensor.of(f"{name}.{n}", t[kv], dims, kv=kv, layer=n)
            for n, t in enumerate(tensors)
            for kv, name in enumerate(("k_buffer", "v_buffer"))
        ]
        snap = Snapshot("sglang", arrays, meta, recorded)
    return State(layout, page_size, shape, device, ids, pages, lengths, tensors, snap, kv_layout)


class Memory:
    """The raw bytes of the live tensors' allocations, read by byte address only."""

    def __init__(self, tensors: list[Any]) -> None:
        storages = {t.untyped_storage().data_ptr(): t for t in tensors}
        self.starts = np.array(sorted(storages), dtype=np.int64)
        self.bytes = []
        for start in self.starts.tolist():
            storage = storages[start].untyped_storage()
            flat = torch.empty(0, dtype=torch.uint8, device=storages[start].device)
            self.bytes.append(flat.set_(storage, 0, (storage.nbytes(),), (1,)))

    def read(self, addresses: np.ndarray, size: int) -> Any:
        """``size`` bytes at each address, as a [len(addresses), size] uint8 tensor; an
        address outside every allocation fails."""
        region = np.searchsorted(self.starts, addresses, side="right") - 1
        assert (region >= 0).all(), "an address below every allocation"
        out = torch.empty((addresses.size, size), dtype=torch.uint8, device=self.bytes[0].device)
        span = torch.arange(size, device=out.device)
        for r, flat in enumerate(self.bytes):
            mine = np.flatnonzero(region == r)
            offset = addresses[mine] - self.starts[r]
            assert (offset + size <= flat.numel()).all(), "an address past its allocation"
            index = torch.from_numpy(offset).to(out.device)[:, None] + span
            out[torch.from_numpy(mine).to(out.device)] = flat[index]
        return out


def by_address(db: pagedkv_sql.Database, state: State, layer: int) -> tuple[Any, Any]:
    """Every token's K and V of ``layer`` ([tokens, H, D] each, requests in build order,
    tokens in position order), read only from the bytes at ``pagedkv_kv_address``."""
    shape, memory = state.shape, Memory([t for t in state.tensors[layer]])
    offsets = np.r_[0, np.cumsum(state.lengths)[:-1]]
    row_of = {rid: i for i, rid in enumerate(state.request_ids)}
    out = [
        torch.empty((state.lengths.sum(), shape.kv_heads, shape.head_dim), dtype=torch.float16)
        for _ in range(2)
    ]
    itemsize = 2
    for head in range(shape.kv_heads):
        t = db.sql(
            "SELECT r.request_id, a.token_pos, CASE a.kv WHEN 'K' THEN 0 ELSE 1 END AS kv, "
            "a.address::BIGINT AS address, a.in_bounds FROM pagedkv_kv_address(?, ?) a "
            "JOIN engine_request r USING (seq_id)",
            params=[layer, head],
        ).to_arrow_table()
        assert all(t.column("in_bounds").to_pylist()), "an address outside its tensor"
        rows = np.array([row_of[r] for r in t.column("request_id").to_pylist()])
        token = offsets[rows] + t.column("token_pos").to_numpy()
        kv = t.column("kv").to_numpy()
        assert t.num_rows == 2 * state.lengths.sum(), "a token without its K and V address"
        vectors = memory.read(t.column("address").to_numpy(), shape.head_dim * itemsize)
        vectors = vectors.view(torch.float16).cpu()
        for which in (0, 1):
            mine = kv == which
            out[which][torch.from_numpy(token[mine]), head] = vectors[torch.from_numpy(mine)]
    return out[0].to(state.device), out[1].to(state.device)


def by_indexing(state: State, layer: int) -> tuple[Any, Any]:
    """The same K and V through each tensor's own indexing, at the engine's own pages."""
    pos = np.concatenate([np.arange(n) for n in state.lengths])
    block = np.concatenate(
        [
            own[np.arange(n) // state.page_size]
            for own, n in zip(state.pages, state.lengths, strict=True)
        ]
    )
    slot = pos % state.page_size
    dev = state.device
    heads = torch.arange(state.shape.kv_heads, device=dev)[None, :]
    cols = {
        "block": torch.from_numpy(block).to(dev)[:, None],
        "slot": torch.from_numpy(slot).to(dev)[:, None],
        "token": torch.from_numpy(block * state.page_size + slot).to(dev)[:, None],
        "head": heads,
        "dim": slice(None),
    }
    out = []
    for kv in (0, 1):
        (tensor, live), *_ = [(c, t) for c, t in state.recorded() if holds(c, layer, kv)]
        index = tuple(kv if name == "kv" else cols[name] for name in tensor.dims)
        out.append(live[index])
    return out[0], out[1]


def attention(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """fp32 attention of queries ``q`` [n, Hq, D] over ``k``, ``v`` [L, H, D]; causal: the
    queries are the last n positions, each sees the positions up to its own."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * q.shape[-1] ** -0.5
    if causal:
        n, length = q.shape[0], k.shape[0]
        seen = torch.arange(length, device=q.device)[None, :] <= (
            length - n + torch.arange(n, device=q.device)[:, None]
        )
        scores = scores.masked_fill(~seen, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class Kernel(Protocol):
    """FlashInfer's decode and paged prefill over the exported arrays (torch tensors on the
    state's device), or a stand-in with their semantics."""

    def plan(self, state: State, arrays: dict[str, Any], qo_indptr: Any) -> None: ...

    def decode(self, state: State, layer: int, q: Any) -> Any: ...

    def prefill(self, state: State, layer: int, q: Any) -> Any: ...


class TorchKernel:
    """FlashInfer's semantics in torch, for the CPU: sequence i's KV is the pages
    ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` of the cache, in order, the last one
    filled to ``kv_last_page_len[i]`` (FlashInfer's page.cuh), unpacked as FlashInfer's
    ``_unpack_paged_kv_cache`` does."""

    def plan(self, state: State, arrays: dict[str, Any], qo_indptr: Any) -> None:
        self.arrays = {name: a.cpu().numpy() for name, a in arrays.items()}
        self.qo_indptr = qo_indptr.cpu().numpy()

    def kv(self, state: State, layer: int, i: int) -> tuple[Any, Any]:
        indptr, indices, last = (self.arrays[name] for name in ARRAYS)
        pages = torch.from_numpy(indices[indptr[i] : indptr[i + 1]].astype(np.int64))
        length = (pages.numel() - 1) * state.page_size + int(last[i])
        cache = state.kernel_cache(layer)
        k, v = cache.unbind(1) if torch.is_tensor(cache) else cache
        out = []
        for x in (k, v):
            if x.dim() == 3:  # page size 1: [pages, H, D]
                x = x.unsqueeze(1)
            x = x[pages.to(x.device)]
            if state.kv_layout == "HND":
                x = x.transpose(1, 2)
            out.append(x.reshape(-1, *x.shape[2:])[:length])
        return out[0], out[1]

    def decode(self, state: State, layer: int, q: Any) -> Any:
        rows = [attention(q[i : i + 1], *self.kv(state, layer, i), False) for i in range(len(q))]
        return torch.cat(rows).half()

    def prefill(self, state: State, layer: int, q: Any) -> Any:
        qo = self.qo_indptr
        rows = [
            attention(q[qo[i] : qo[i + 1]], *self.kv(state, layer, i), True)
            for i in range(qo.size - 1)
        ]
        return torch.cat(rows).half()


@dataclasses.dataclass
class Figures:
    """What one scenario measured."""

    tokens: int
    pages: int
    vectors: int  # K and V vectors compared bit for bit
    decode_error: float  # max |kernel - reference|
    prefill_error: float
    caught: float  # the smallest error of a request the planted swap touches


def check_import_and_export(db: pagedkv_sql.Database, state: State) -> tuple[Any, list[int]]:
    """The state through the public API and back as FlashInfer's arrays: each request's
    own pages, int32, the layout to plan with, the cache tensors carried. Returns the
    export and each exported row's request (build order)."""
    report = db.load_engine(state.snapshot)
    assert report.warnings == [], report.warnings
    assert db.check().ok(strict=True), db.violations().to_pylist()[:3]
    exported = export_arrays(db, "flashinfer")
    snap = exported.snapshot
    assert exported.refused == [], exported.refused
    assert all(snap.arrays[name].dtype == np.int32 for name in ARRAYS)
    rows = [state.request_ids.index(r) for r in snap.meta["request_ids"]]
    want = np.concatenate([state.pages[r] for r in rows])
    assert np.array_equal(snap.arrays["kv_indices"], want), "exported pages are not the engine's"
    last = (state.lengths[rows] - 1) % state.page_size + 1
    assert np.array_equal(snap.arrays["kv_last_page_len"], last)
    assert snap.meta["kv_layout"] == state.kv_layout
    assert snap.cache_tensors == state.snapshot.cache_tensors
    with tempfile.TemporaryDirectory() as tmp:  # its import keeps every address
        exported.write(Path(tmp) / "out")
        with pagedkv_sql.connect(":memory:") as again:
            again.load_engine(Path(tmp) / "out" / "flashinfer.npz")
            assert addresses(again) == addresses(db), "an export's import moved addresses"
    return exported, rows


def addresses(db: pagedkv_sql.Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT r.request_id, a.token_pos, a.kv, a.address FROM pagedkv_kv_address(1, 0) a "
        "JOIN engine_request r USING (seq_id) ORDER BY ALL"
    ).fetchall()


def errors(got: Any, want: Any, bounds: np.ndarray) -> np.ndarray:
    """The max |got - want| of each request's rows (``bounds``: its rows' indptr)."""
    diff = (got.float() - want.float()).abs().amax(dim=(1, 2)).cpu().numpy()
    return np.array([diff[a:b].max() for a, b in itertools.pairwise(bounds)])


def run(state: State, kernel: Kernel) -> Figures:
    """The whole scenario on one state (module docstring); fails at the first broken
    promise, else returns what it measured."""
    shape, dev = state.shape, state.device
    with pagedkv_sql.connect(":memory:") as db:
        exported, rows = check_import_and_export(db, state)
        reference = [by_address(db, state, layer) for layer in range(shape.layers)]
    vectors = 0
    for layer, (k, v) in enumerate(reference):  # the bytes are the tensor's own
        own_k, own_v = by_indexing(state, layer)
        for a, b in ((k, own_k), (v, own_v)):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), (state.layout, layer)
            vectors += a.shape[0] * a.shape[1]
    rng = np.random.default_rng([shape.seed, 7])
    lengths = state.lengths[rows]
    q_lens = np.array([rng.integers(1, min(n, shape.max_query) + 1) for n in lengths])
    qo_indptr = np.r_[0, np.cumsum(q_lens)]
    gen = torch.Generator(device=dev).manual_seed(shape.seed + 1)
    qd = torch.randn((len(rows), shape.qo_heads, shape.head_dim), generator=gen, device=dev)
    qp = torch.randn(
        (int(qo_indptr[-1]), shape.qo_heads, shape.head_dim), generator=gen, device=dev
    )
    qd, qp = qd.half(), qp.half()
    offsets = np.r_[0, np.cumsum(state.lengths)]
    want_d, want_p = [], []
    for k, v in reference:
        kv = [(k[offsets[r] : offsets[r + 1]], v[offsets[r] : offsets[r + 1]]) for r in rows]
        want_d.append(
            torch.cat([attention(qd[i : i + 1], *kv[i], False) for i in range(len(rows))])
        )
        want_p.append(
            torch.cat(
                [
                    attention(qp[qo_indptr[i] : qo_indptr[i + 1]], *kv[i], True)
                    for i in range(len(rows))
                ]
            )
        )
    arrays = {n: torch.from_numpy(exported.snapshot.arrays[n]).to(dev) for n in ARRAYS}
    qo = torch.from_numpy(qo_indptr.astype(np.int32)).to(dev)

    def outputs(planned: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        kernel.plan(state, planned, qo)
        d = [
            errors(kernel.decode(state, n, qd), want_d[n], np.arange(len(rows) + 1))
            for n in range(shape.layers)
        ]
        p = [
            errors(kernel.prefill(state, n, qp), want_p[n], qo_indptr) for n in range(shape.layers)
        ]
        return np.max(d, axis=0), np.max(p, axis=0)

    decode, prefill = outputs(arrays)
    assert decode.max() <= ATOL and prefill.max() <= ATOL, (decode.max(), prefill.max())
    # the negative control: the first pages of the two longest requests swapped
    a, b = np.argsort(-lengths, kind="stable")[:2]
    planted = {n: t.clone() for n, t in arrays.items()}
    ia, ib = int(arrays["kv_indptr"][a]), int(arrays["kv_indptr"][b])
    planted["kv_indices"][ia], planted["kv_indices"][ib] = (
        arrays["kv_indices"][ib],
        arrays["kv_indices"][ia],
    )
    bad_d, bad_p = outputs(planted)
    for found in (bad_d, bad_p):
        caught = set(np.flatnonzero(found > ATOL).tolist())
        assert caught == {int(a), int(b)}, (caught, int(a), int(b), found)
    return Figures(
        tokens=int(state.lengths.sum()),
        pages=sum(p.size for p in state.pages),
        vectors=vectors,
        decode_error=float(decode.max()),
        prefill_error=float(prefill.max()),
        caught=float(min(bad_d[[a, b]].min(), bad_p[[a, b]].min())),
    )
