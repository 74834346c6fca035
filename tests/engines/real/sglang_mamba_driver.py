"""Drive SGLang's Mamba hybrid cache on the CPU: a ``HybridReqToTokenPool`` (each row with
a ``MambaPool`` state slot from its ``MambaSlotAllocator``), a ``HybridLinearKVPool`` of the
full-attention layer with its token allocator, and a ``UnifiedRadixCache`` of the FULL and
MAMBA components (page size 1: SGLang's MambaComponent requires it without the extra
buffer), under the scheduler's own paths (``BatchScheduler``)."""

from __future__ import annotations

import types
from typing import Any

from .helpers import engine_modules
from .sglang_driver import BatchScheduler, publish

(torch, _sb, _mamba_utils, _memory_pool, _token, _components, _unified, _init) = engine_modules(
    "torch",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.configs.mamba_utils",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.unified_cache.components",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
)


class MambaScheduler(BatchScheduler):
    """``BatchScheduler`` over the Mamba hybrid pools: ``slots`` state slots, ``tokens`` KV
    slots of the full-attention layer."""

    def __init__(self, slots: int = 8, tokens: int = 256, rows: int = 8) -> None:
        publish(1)
        self.page_size = 1
        shape = _mamba_utils.Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=256,
            n_groups=1,
            num_heads=8,
            head_dim=32,
            state_size=16,
            conv_kernel=4,
        )
        params = _mamba_utils.Mamba2CacheParams(shape=shape, layers=[0])
        self.rtt = _memory_pool.HybridReqToTokenPool(
            size=rows,
            mamba_size=slots,
            mamba_spec_state_size=slots,
            max_context_len=512,
            device="cpu",
            enable_memory_saver=False,
            cache_params=params,
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False,
        )
        self.kv = _memory_pool.HybridLinearKVPool(
            size=tokens,
            dtype=torch.float16,
            page_size=1,
            head_num=2,
            head_dim=8,
            full_attention_layer_ids=[1],
            device="cpu",
            mamba_pool=self.rtt.mamba_pool,
        )
        self.allocator = _token.TokenToKVPoolAllocator(tokens, torch.float16, "cpu", self.kv, False)
        kinds = _components.ComponentType
        self.tree = _unified.UnifiedRadixCache(
            _init.CacheInitParams(
                disable=False,
                req_to_token_pool=self.rtt,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
                tree_components=(kinds.FULL, kinds.MAMBA),
            )
        )
        self.model_config = types.SimpleNamespace(vocab_size=512, is_encoder_decoder=False)
        self.running: Any = None
        self.retracted: list[Any] = []

    def finish(self, rid: str) -> None:
        """The request ends as the scheduler ends it: marked finished first (0.5.23 keeps
        a finished request's state only), then released."""
        req = next(r for r in self.running.reqs if r.rid == rid)
        req.finished_reason = _sb.FINISH_LENGTH(len(req.output_ids))
        super().finish(rid)

    def slot(self, rid: str) -> int:
        """The request's Mamba state slot."""
        req = next(r for r in self.running.reqs if r.rid == rid)
        return int(self.rtt.req_index_to_mamba_index_mapping[req.kv.req_pool_idx])
