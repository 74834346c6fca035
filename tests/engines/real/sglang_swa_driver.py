"""Drive SGLang's sliding-window hybrid cache on the CPU: an ``SWAKVPool`` (full-attention
layer 1, sliding-window layer 0), its ``SWATokenToKVPoolAllocator`` and a
``UnifiedRadixCache`` of the FULL and SWA components, under the scheduler's own paths
(``BatchScheduler``: real ``Req``s and ``ScheduleBatch``es; a decode step's
``alloc_for_decode`` calls ``maybe_evict_swa``, which frees each request's SWA pages that
left its window).

SGLang frees a window's pages once ``SGLANG_SWA_EVICTION_INTERVAL`` tokens (default 128)
have left it; the driver sets it to 1 (a setting of the engine's) so that a schedule of a
few dozen tokens drops pages from the window."""

from __future__ import annotations

import os
import types
from typing import Any

from .helpers import engine_modules
from .sglang_driver import BatchScheduler, publish

os.environ.setdefault("SGLANG_SWA_EVICTION_INTERVAL", "1")

(torch, _swa_pool, _swa_alloc, _components, _unified, _init, _memory_pool) = engine_modules(
    "torch",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.allocator.swa",
    "sglang.srt.mem_cache.unified_cache.components",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.memory_pool",
)

PAGE = 4
WINDOW = 8  # SGLang's sliding_window_size: a query sees 8 tokens before it


class SWAScheduler(BatchScheduler):
    """``BatchScheduler`` over the sliding-window pools: ``full_pages`` pages of full
    attention, ``swa_pages`` of the window's layers (fewer: a window needs less)."""

    def __init__(
        self, full_pages: int = 16, swa_pages: int = 8, rows: int = 8, page_size: int = PAGE
    ) -> None:
        publish(page_size)
        self.page_size = page_size
        full, swa = full_pages * page_size, swa_pages * page_size
        self.kv = _swa_pool.SWAKVPool(
            size=full,
            size_swa=swa,
            page_size=page_size,
            dtype=torch.float16,
            head_num=2,
            head_dim=8,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device="cpu",
        )
        self.allocator = _swa_alloc.SWATokenToKVPoolAllocator(
            full, swa, page_size, torch.float16, "cpu", self.kv, need_sort=False
        )
        self.rtt = _memory_pool.ReqToTokenPool(
            size=rows, max_context_len=512, device="cpu", enable_memory_saver=False
        )
        kinds = _components.ComponentType
        self.tree = _unified.UnifiedRadixCache(
            _init.CacheInitParams(
                disable=False,
                req_to_token_pool=self.rtt,
                token_to_kv_pool_allocator=self.allocator,
                page_size=page_size,
                sliding_window_size=WINDOW,
                tree_components=(kinds.FULL, kinds.SWA),
            )
        )
        self.model_config = types.SimpleNamespace(vocab_size=512, is_encoder_decoder=False)
        self.running: Any = None
        self.retracted: list[Any] = []

    def req(self, rid: str) -> Any:
        return next(r for r in self.running.reqs if r.rid == rid)

    def swa_slots(self, rid: str) -> list[int]:
        """The request's SWA slot per position (0: dropped from the window)."""
        full = torch.tensor(self.rows()[rid], dtype=torch.int64)
        return self.allocator.translate_loc_from_full_to_swa(full).tolist()

    def evicted(self, rid: str) -> int:
        """How many leading positions the window dropped (SGLang's SWA cursor)."""
        return int(self.req(rid).kv.get_evicted_seqlen(_components.ComponentType.SWA))
