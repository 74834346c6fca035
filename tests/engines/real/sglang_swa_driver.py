"""Drive SGLang's sliding-window hybrid cache on the CPU: an ``SWAKVPool`` (full-attention
layer 1, sliding-window layer 0), its ``SWATokenToKVPoolAllocator`` and a
``UnifiedRadixCache`` of the FULL and SWA components (built by the fuzzer's ``swa_pools``),
under the scheduler's own paths (``BatchScheduler``: real ``Req``s and ``ScheduleBatch``es;
a decode step's
``alloc_for_decode`` calls ``maybe_evict_swa``, which frees each request's SWA pages that
left its window).

SGLang frees a window's pages once ``SGLANG_SWA_EVICTION_INTERVAL`` tokens (default 128)
have left it; the driver sets it to 1 (a setting of the engine's) so that a schedule of a
few dozen tokens drops pages from the window."""

from __future__ import annotations

import os
import types
from typing import Any

from pagedkv_sql.engines.sglang_swa import window_freed
from pagedkv_sql.fuzz.sglang_kinds import WINDOW_PAGES, pure_swa_pools, swa_pools

from .helpers import engine_modules
from .sglang_driver import BatchScheduler, publish

os.environ.setdefault("SGLANG_SWA_EVICTION_INTERVAL", "1")

(torch, _components) = engine_modules("torch", "sglang.srt.mem_cache.unified_cache.components")

PAGE = 4
WINDOW = WINDOW_PAGES * PAGE  # SGLang's sliding_window_size: a query sees 8 tokens before it


def adopt(scheduler: BatchScheduler, built: Any, page_size: int) -> None:
    """Set a ``BatchScheduler`` up over pools the fuzzer built (``swa_pools``,
    ``mamba_pools``): SGLang's configuration published, no batch running yet."""
    publish(page_size)
    scheduler.page_size = page_size
    scheduler.kv, scheduler.allocator = built.kv, built.allocator
    scheduler.rtt, scheduler.tree = built.rtt, built.tree
    scheduler.model_config = types.SimpleNamespace(vocab_size=512, is_encoder_decoder=False)
    scheduler.running = None
    scheduler.retracted = []


class SWAScheduler(BatchScheduler):
    """``BatchScheduler`` over the sliding-window pools: ``full_pages`` pages of full
    attention, ``swa_pages`` of the window's layers (fewer: a window needs less)."""

    def __init__(self, full_pages: int = 16, swa_pages: int = 8, page_size: int = PAGE) -> None:
        adopt(self, swa_pools(full_pages, page_size, swa_pages), page_size)

    def req(self, rid: str) -> Any:
        return next(r for r in self.running.reqs if r.rid == rid)

    def swa_slots(self, rid: str) -> list[int]:
        """The request's SWA slot per position (0: dropped from the window)."""
        full = torch.tensor(self.rows()[rid], dtype=torch.int64)
        return self.allocator.translate_loc_from_full_to_swa(full).tolist()

    def evicted(self, rid: str) -> int:
        """How many leading positions the window dropped (SGLang's SWA cursor)."""
        return int(self.req(rid).kv.get_evicted_seqlen(_components.ComponentType.SWA))


class PureSWAScheduler(BatchScheduler):
    """``BatchScheduler`` over the all-sliding-window pools (``pure_swa_pools``: one pool
    of ``pages`` slots, page size 1, a window of PURE_WINDOW tokens). Each prefill sets the
    request's SWA floor to its prefill's end, as SGLang's scheduler does for a
    prefill-aware sliding-window model (the one that runs this cache)."""

    def __init__(self, pages: int = 48) -> None:
        adopt(self, pure_swa_pools(pages), 1)

    def prefill(self, *prompts: tuple[str, list[int]]) -> list[Any]:
        reqs = super().prefill(*prompts)
        for req in reqs:
            req.kv.swa_evict_floor = int(req.kv.kv_allocated_len)
        return reqs

    def req(self, rid: str) -> Any:
        return next(r for r in self.running.reqs if r.rid == rid)

    def freed(self, rid: str) -> tuple[int, int]:
        """The positions ``[lo, hi)`` of the request's row its window freed."""
        return window_freed(self.req(rid), 1)
