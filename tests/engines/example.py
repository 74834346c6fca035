"""The FlashInfer snapshot shipped as data/engines/flashinfer.npz for the README: three
requests on a 16-page NHD bf16 cache, two sharing a prefix page, the third with an
empty last page (kv_last_page_len 0, an engine bug the invariants catch)."""

from __future__ import annotations

import numpy as np

from pagedkv_sql.engines import CacheTensor, Snapshot, flashinfer

from ..helpers import DATA

PATH = DATA / "engines" / "flashinfer.npz"
POINTER = 0x7F3A00000000  # where the cache tensor was, as data_ptr() said
SHAPE = (16, 2, 16, 8, 128)  # [num_pages, 2, page_size, H, D]: NHD


def example() -> Snapshot:
    strides = tuple(int(np.prod(SHAPE[i + 1 :])) for i in range(len(SHAPE)))
    cache = CacheTensor(
        "paged_kv_cache",
        SHAPE,
        strides,
        "bfloat16",
        2,
        ("block", "kv", "slot", "head", "dim"),
        POINTER,
    )
    snap = flashinfer.snapshot(
        kv_indptr=np.array([0, 3, 5, 7], dtype=np.int32),
        kv_indices=np.array([5, 7, 9, 5, 2, 11, 12], dtype=np.int32),
        kv_last_page_len=np.array([3, 4, 0], dtype=np.int32),
        page_size=16,
        request_ids=["chat-41", "chat-42", "chat-43"],
    )
    snap.cache_tensors.append(cache)
    return snap


if __name__ == "__main__":  # python -m tests.engines.example: write the file again
    PATH.parent.mkdir(exist_ok=True)
    example().save(PATH)
