"""FlashInfer's own kernels read every token where pagedkv-sql says it is: for each layout
and page size (tests/gpu/attention.py), the exported arrays plan FlashInfer's
``BatchDecodeWithPagedKVCacheWrapper`` and ``BatchPrefillWithPagedKVCacheWrapper`` (causal,
partly filled last pages), whose outputs equal attention over the bytes at the project's
addresses; a planted page swap is caught for exactly its two requests; a planned wrapper's
own buffers (CUDA tensors) import as the same page table. The same scenario runs on the CPU
in tests/engines/test_flashinfer_attention.py with torch in place of the kernels."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import pagedkv_sql

LAYOUTS = ["flashinfer NHD", "flashinfer HND", "K, V pair NHD", "K, V pair HND", "vllm", "sglang"]
WORKSPACE = 128 << 20  # bytes, as FlashInfer's examples allocate
FIGURES = os.environ.get("PAGEDKV_GPU_FIGURES")  # a JSON Lines file the figures go to


class FlashInferKernel:
    """FlashInfer's decode and paged prefill wrappers, planned with the exported arrays: the
    CUDA-core decode kernel and the FA2 prefill, named rather than left to ``auto`` (which
    may pick cuDNN where it is installed)."""

    def __init__(self, gpu: SimpleNamespace) -> None:
        torch = gpu.torch
        self.fi, self.torch = gpu.flashinfer, torch
        self.workspace = [
            torch.zeros(WORKSPACE, dtype=torch.uint8, device=gpu.device) for _ in "dp"
        ]

    def plan(self, state: Any, arrays: dict[str, Any], qo_indptr: Any) -> None:
        s, half = state.shape, self.torch.float16
        heads = (s.qo_heads, s.kv_heads, s.head_dim, state.page_size)
        csr = [arrays[n] for n in ("kv_indptr", "kv_indices", "kv_last_page_len")]
        self.decode_wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace[0],
            state.kv_layout,
            backend="fa2",  # the CUDA-core decode kernel
        )
        self.decode_wrapper.plan(*csr, *heads, q_data_type=half, kv_data_type=half)
        self.prefill_wrapper = self.fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace[1], state.kv_layout, backend="fa2"
        )
        self.prefill_wrapper.plan(
            qo_indptr, *csr, *heads, causal=True, q_data_type=half, kv_data_type=half
        )

    def decode(self, state: Any, layer: int, q: Any) -> Any:
        return self.decode_wrapper.run(q, state.kernel_cache(layer))

    def prefill(self, state: Any, layer: int, q: Any) -> Any:
        return self.prefill_wrapper.run(q, state.kernel_cache(layer))


def shape() -> Any:
    from .attention import Shape

    # about the size of the state first tried by hand on an H200 (48 requests, 79k tokens)
    return Shape(requests=32, max_pages=48, spare_pages=64, kv_heads=8, qo_heads=32, head_dim=128)


# each layout at each page size through both kernels, then the capture of a planned
# wrapper; one test function, so that where the tier cannot run it says so on one line
CASES = [("kernels", layout, page) for layout in LAYOUTS for page in (1, 16, 32)]
CASES += [("capture", "flashinfer HND", 16), ("capture", "sglang", 16)]


@pytest.mark.parametrize(("what", "layout", "page_size"), CASES)
def test_flashinfer_on_the_exported_state(
    gpu: SimpleNamespace, what: str, layout: str, page_size: int
) -> None:
    if what == "kernels":
        kernels_read_every_token_where_its_address_says(gpu, layout, page_size)
    else:
        a_planned_wrapper_imports_as_its_page_table(gpu, layout, page_size)


def kernels_read_every_token_where_its_address_says(
    gpu: SimpleNamespace, layout: str, page_size: int
) -> None:
    from .attention import ATOL, build, run

    state = build(layout, page_size, shape(), gpu.device)
    figures = run(state, FlashInferKernel(gpu))
    assert figures.decode_error <= ATOL < figures.caught
    if FIGURES:
        line = {"layout": layout, "page_size": page_size, "device": gpu.name}
        with open(FIGURES, "a") as f:
            f.write(json.dumps({**line, **dataclasses.asdict(figures)}) + "\n")


def a_planned_wrapper_imports_as_its_page_table(
    gpu: SimpleNamespace, layout: str, page_size: int
) -> None:
    """``flashinfer.capture`` of a live decode wrapper (its buffers CUDA tensors, copied to
    the host once) gives every request the pages and addresses the engine's import gave."""
    from pagedkv_sql.engines import flashinfer

    from .attention import ARRAYS, build, check_import_and_export

    state = build(layout, page_size, shape(), gpu.device)
    torch = gpu.torch
    with pagedkv_sql.connect(":memory:") as db:
        exported, _ = check_import_and_export(db, state)
        arrays = {n: torch.from_numpy(exported.snapshot.arrays[n]).to(gpu.device) for n in ARRAYS}
        qo = torch.arange(len(exported.snapshot.meta["request_ids"]) + 1, dtype=torch.int32)
        kernel = FlashInferKernel(gpu)
        kernel.plan(state, arrays, qo.to(gpu.device))
        assert kernel.decode_wrapper._paged_kv_indices_buf.device.type == gpu.device
        caches = [state.kernel_cache(n) for n in range(state.shape.layers)]
        snap = flashinfer.capture(
            kernel.decode_wrapper,
            state.page_size,
            layers=caches,
            request_ids=exported.snapshot.meta["request_ids"],
        )
        assert snap.meta["kv_layout"] == state.kv_layout
        for name in ARRAYS:
            np.testing.assert_array_equal(snap.arrays[name], exported.snapshot.arrays[name])
        with pagedkv_sql.connect(":memory:") as again:
            again.load_engine(snap)
            query = (
                "SELECT r.request_id, a.token_pos, a.physical_address FROM resolved_kv_address a "
                "JOIN engine_request r USING (seq_id) ORDER BY ALL"
            )
            assert again.sql(query).fetchall() == db.sql(query).fetchall()
