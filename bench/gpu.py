"""Export of a stored FlashInfer state as FlashInfer's own arrays, against FlashInfer's own
``plan()`` and one decode ``run()`` on the same state, as ratios measured in one run (not a
test).

    python bench/gpu.py --sizes 1000000,10000000 [--repeat 5] [--json FILE]

For each size N: a FlashInfer state of N tokens (requests of 500 to 1,500 tokens, 16-token
pages in random order over a pool with 10% spare pages, 8 KV heads of 128, fp16, one
layer), imported with ``load_engine`` (the cache tensor's layout recorded) and exported with
``export_arrays(db, "flashinfer")``. On a CUDA device with FlashInfer installed the KV cache
is allocated there (4.4 GiB a million tokens), the export's arrays copied to it,
``BatchDecodeWithPagedKVCacheWrapper`` planned with them and run once (32 query heads);
ratios: export / plan and export / (plan + run). Without one, the import and the export are
measured alone and the baselines said to need a GPU. Figures: the median of ``--repeat``
rounds, after one warm-up round (FlashInfer's JIT build). tools/gpu_run.sh runs it on a GPU
machine; the figures are in docs/benchmarks.md, "Export against FlashInfer's plan and run".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# the checkout beside this file, not another install: a sys.path change, allowed among imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pagedkv_sql
from pagedkv_sql.engines import CacheTensor, export_arrays, flashinfer

PAGE, KV_HEADS, QO_HEADS, HEAD_DIM = 16, 8, 32, 128
WORKSPACE = 128 << 20


def state(tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """FlashInfer's arrays of a random state of exactly ``tokens`` tokens, and its pool's
    pages: (kv_indptr, kv_indices, kv_last_page_len, num_pages)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(500, 1501, tokens // 500 + 1)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    lengths[-1] -= int(lengths.sum()) - tokens
    pages = -(-lengths // PAGE)
    num_pages = int(pages.sum() * 1.1) + 1
    indices = rng.permutation(num_pages)[: pages.sum()].astype(np.int32)
    indptr = np.r_[0, np.cumsum(pages)].astype(np.int32)
    last = (lengths - (pages - 1) * PAGE).astype(np.int32)
    return indptr, indices, last, num_pages


def timed(fn: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> float:
    """The median seconds of ``repeat`` calls, after one not counted."""
    fn()
    sync()
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        rounds.append(time.perf_counter() - start)
    return statistics.median(rounds)


def gpu() -> tuple[Any, Any] | str:
    """(torch, flashinfer) where a CUDA device and FlashInfer are here, else why not."""
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__})"
    try:
        import flashinfer as fi
    except ImportError as e:
        return f"no FlashInfer ({e})"
    return torch, fi


def measure(tokens: int, repeat: int, kernels: tuple[Any, Any] | str) -> dict[str, Any]:
    indptr, indices, last, num_pages = state(tokens)
    shape = (num_pages, 2, PAGE, KV_HEADS, HEAD_DIM)
    row: dict[str, Any] = {"tokens": tokens, "requests": indptr.size - 1, "pages": num_pages}
    if isinstance(kernels, str):
        cache: Any = None  # the layout alone: an aligned pointer, no memory behind it
        strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
        dims = ("block", "kv", "slot", "head", "dim")
        tensors = [CacheTensor("paged_kv_cache", shape, strides, "float16", 2, dims, 1 << 40)]
        snap = flashinfer.snapshot(indptr, indices, last, PAGE, kv_layout="NHD")
        snap.cache_tensors = tensors
        sync: Callable[[], None] = lambda: None  # noqa: E731
    else:
        torch, fi = kernels
        cache = torch.empty(shape, dtype=torch.float16, device="cuda").normal_()
        snap = flashinfer.snapshot(indptr, indices, last, PAGE, paged_kv_cache=cache)
        sync = torch.cuda.synchronize
    with pagedkv_sql.connect(":memory:") as db:
        start = time.perf_counter()
        db.load_engine(snap, diagnostics=False)
        row["import_s"] = time.perf_counter() - start
        row["export_s"] = timed(lambda: export_arrays(db, "flashinfer"), repeat, sync)
        exported = export_arrays(db, "flashinfer").snapshot.arrays
    assert np.array_equal(exported["kv_indices"], indices), "the export is not the state"
    if isinstance(kernels, str):
        return row
    names = ("kv_indptr", "kv_indices", "kv_last_page_len")
    row["to_device_s"] = timed(
        lambda: [torch.from_numpy(exported[n]).cuda() for n in names], repeat, sync
    )
    arrays = [torch.from_numpy(exported[n]).cuda() for n in names]
    workspace = torch.zeros(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    heads = (QO_HEADS, KV_HEADS, HEAD_DIM, PAGE)
    half = torch.float16

    def plan() -> None:
        wrapper.plan(*arrays, *heads, q_data_type=half, kv_data_type=half)

    q = torch.randn((indptr.size - 1, QO_HEADS, HEAD_DIM), dtype=half, device="cuda")
    row["plan_s"] = timed(plan, repeat, sync)
    row["run_s"] = timed(lambda: wrapper.run(q, cache), repeat, sync)
    row["export_per_plan"] = row["export_s"] / row["plan_s"]
    row["export_per_plan_and_run"] = row["export_s"] / (row["plan_s"] + row["run_s"])
    return row


def table(rows: list[dict[str, Any]], kernels: tuple[Any, Any] | str) -> list[str]:
    ms = ("import_s", "export_s", "to_device_s", "plan_s", "run_s")
    head = ["tokens", "requests", *[f"{m[:-2]} ms" for m in ms]]
    head += ["export / plan", "export / (plan + run)"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [f"{r['tokens']:,}", f"{r['requests']:,}"]
        cells += [f"{r[m] * 1000:.1f}" if m in r else "-" for m in ms]
        cells += [
            f"{r[k]:.1f}x" if k in r else "-"
            for k in ("export_per_plan", "export_per_plan_and_run")
        ]
        out.append("| " + " | ".join(cells) + " |")
    if isinstance(kernels, str):
        out.append(f"FlashInfer's plan and run need a GPU: {kernels}; the export alone above")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="tokens, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="rounds a figure (median)")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    kernels = gpu()
    where = "no GPU" if isinstance(kernels, str) else kernels[0].cuda.get_device_name()
    header = (
        f"# export vs FlashInfer plan/run: {platform.platform()}, {os.cpu_count()} cores, "
        f"{where}, Python {platform.python_version()}, pagedkv-sql {pagedkv_sql.__version__}"
    )
    print(header, flush=True)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.append(measure(size, args.repeat, kernels))
        print(f"{size:,} tokens: {rows[-1]}", flush=True)
    print("\n".join(table(rows, kernels)))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
