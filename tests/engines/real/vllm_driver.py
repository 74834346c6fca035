"""Drive the real vLLM v1 KVCacheManager on the CPU, as its scheduler does: look up the
prefix cache, allocate slots, grow a running request token by token, free."""

from __future__ import annotations

from typing import Any

from .helpers import engine_modules

torch, _manager, _utils, _spec, _request, _sampling, _hashing = engine_modules(
    "torch",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.request",
    "vllm.sampling_params",
    "vllm.utils.hashing",
)

BLOCK_SIZE = 16
_utils.init_none_hash(_hashing.sha256)


class Engine:
    """A KVCacheManager over ``num_blocks`` blocks, one full-attention group, prefix
    caching on, KV events on; and the requests it serves, by id."""

    def __init__(self, num_blocks: int = 16, block_size: int = BLOCK_SIZE) -> None:
        spec = _spec.FullAttentionSpec(
            block_size=block_size, num_kv_heads=2, head_size=8, dtype=torch.float16
        )
        config = _spec.KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[_spec.KVCacheGroupSpec(["layers.0.attn"], spec)],
        )
        self.block_size = block_size
        self.manager = _manager.KVCacheManager(
            config,
            max_model_len=1024,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            enable_caching=True,
            enable_kv_cache_events=True,
        )
        self.hasher = _utils.get_request_block_hasher(block_size, _hashing.sha256)
        self.requests: dict[str, Any] = {}

    @property
    def pool(self) -> Any:
        return self.manager.block_pool

    def request(self, request_id: str, prompt: list[int]) -> Any:
        r = _request.Request(
            request_id,
            prompt,
            _sampling.SamplingParams(max_tokens=64),
            None,
            block_hasher=self.hasher,
        )
        self.requests[request_id] = r
        return r

    def schedule(self, request_id: str, prompt: list[int]) -> Any:
        """A new request's first step: prefix-cache lookup, then slots for the rest."""
        r = self.request(request_id, prompt)
        hit, num_hit, _ = self.manager.get_computed_blocks(r)
        new = self.manager.allocate_slots(r, r.num_tokens - num_hit, num_hit, hit)
        assert new is not None, f"no room for {request_id}"
        r.num_computed_tokens = r.num_tokens
        return r

    def decode(self, request_id: str, token: int) -> None:
        """One generated token: append it, then allocate its slot."""
        r = self.requests[request_id]
        r.append_output_token_ids(token)
        assert self.manager.allocate_slots(r, 1) is not None
        r.num_computed_tokens = r.num_tokens

    def finish(self, request_id: str) -> None:
        r = self.requests.pop(request_id)
        r.status = _request.RequestStatus.FINISHED_STOPPED  # as vLLM sets it before free()
        self.manager.free(r)

    def blocks(self, request_id: str) -> list[int]:
        return list(self.manager.get_block_ids(request_id)[0])

    def ref_cnt(self, block_id: int) -> int:
        return int(self.pool.blocks[block_id].ref_cnt)


class Scheduler(Engine):
    """vLLM's own order of a step (v1/core/sched/scheduler.py): allocate the slots of the
    tokens to compute (a prefill chunk, or the last sampled token) plus any lookahead
    slots, count them computed, and once a request's tokens are all computed, sample one
    more token, whose KV is not written until its next step."""

    def __init__(self, num_blocks: int = 16, block_size: int = BLOCK_SIZE) -> None:
        super().__init__(num_blocks, block_size)
        self.sampled = 0

    def admit(
        self, request_id: str, prompt: list[int], chunk: int | None = None, lookahead: int = 0
    ) -> Any:
        """A waiting request's first step: the prefix-cache lookup, then slots for its
        first chunk (the whole rest of the prompt without ``chunk``); None when there is
        no room (the request stays waiting, holding nothing)."""
        r = self.request(request_id, prompt)
        if not self.resume(request_id, chunk, lookahead):
            del self.requests[request_id]
            return None
        return r

    def resume(self, request_id: str, chunk: int | None = None, lookahead: int = 0) -> bool:
        """A waiting (new or preempted) request scheduled: prefix-cache lookup, slots for
        a chunk of the rest; False (holding nothing) when there is no room."""
        r = self.requests[request_id]
        hit, num_hit, _ = self.manager.get_computed_blocks(r)
        todo = r.num_tokens - num_hit if chunk is None else min(chunk, r.num_tokens - num_hit)
        new = self.manager.allocate_slots(r, todo, num_hit, hit, num_lookahead_tokens=lookahead)
        if new is None:
            self.manager.free(r)
            return False
        r.num_computed_tokens = num_hit + todo
        self._sample(r)
        return True

    def step(self, request_id: str, chunk: int | None = None, lookahead: int = 0) -> bool:
        """A running request's next step: its next prefill chunk, or its sampled token;
        False when there is no room (nothing changed)."""
        r = self.requests[request_id]
        todo = r.num_tokens - r.num_computed_tokens
        todo = todo if chunk is None else min(chunk, todo)
        if self.manager.allocate_slots(r, todo, num_lookahead_tokens=lookahead) is None:
            return False
        r.num_computed_tokens += todo
        self._sample(r)
        return True

    def preempt(self, request_id: str) -> None:
        """As Scheduler._preempt_request: free the blocks, forget the computed tokens."""
        r = self.requests[request_id]
        self.manager.free(r)
        r.num_computed_tokens = 0

    def _sample(self, r: Any) -> None:
        if r.num_computed_tokens == r.num_tokens:
            self.sampled += 1
            r.append_output_token_ids(5000 + self.sampled)
