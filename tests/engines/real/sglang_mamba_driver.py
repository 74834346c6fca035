"""Drive SGLang's Mamba hybrid cache on the CPU: a ``HybridReqToTokenPool`` (each row with
a ``MambaPool`` state slot from its ``MambaSlotAllocator``), a ``HybridLinearKVPool`` of the
full-attention layer with its token allocator, and a ``UnifiedRadixCache`` of the FULL and
MAMBA components (page size 1: SGLang's MambaComponent requires it without the extra
buffer; built by the fuzzer's ``mamba_pools``), under the scheduler's own paths
(``BatchScheduler``)."""

from __future__ import annotations

from pagedkv_sql.fuzz.sglang_kinds import mamba_pools

from .helpers import engine_modules
from .sglang_driver import BatchScheduler, publish
from .sglang_swa_driver import adopt

(torch, _sb) = engine_modules("torch", "sglang.srt.managers.schedule_batch")


class MambaScheduler(BatchScheduler):
    """``BatchScheduler`` over the Mamba hybrid pools: ``slots`` state slots, ``tokens`` KV
    slots of the full-attention layer."""

    def __init__(self, slots: int = 8, tokens: int = 256) -> None:
        publish(1)  # SGLang's Mamba component reads the published ServerArgs
        adopt(self, mamba_pools(tokens, 1, slots), 1)

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
