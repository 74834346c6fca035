"""A hypothesis state machine over vLLM 0.32's real KVCacheManager, in vLLM's step order
(allocate, count computed, sample), with the planted bugs that mutate its BlockPool."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

from .core import Outcome, Stats, check, engine_call, hypothesis_module, run

PLANTS = ("skip_decrement", "double_free", "touch_keeps_queued", "reversed_hit")


@contextlib.contextmanager
def planted(bug: str | None) -> Iterator[None]:
    """Monkeypatch one of vLLM's own methods with a real bug for the run's length."""
    if bug is None:
        yield
        return
    from vllm.v1.core import block_pool, kv_cache_manager

    pool_cls = block_pool.BlockPool
    mgr_cls = kv_cache_manager.KVCacheManager
    target, name = (
        (mgr_cls, "get_computed_blocks")
        if bug == "reversed_hit"
        else (
            pool_cls,
            "touch" if bug == "touch_keeps_queued" else "free_blocks",
        )
    )
    original = getattr(target, name)

    def free_blocks(self: Any, ordered: Any) -> None:
        blocks = list(ordered)
        if bug == "skip_decrement":
            shared = [b for b in blocks if b.ref_cnt > 1]
            if shared:
                shared[0].ref_cnt += 1  # its decrement is skipped
        elif bug == "double_free" and len(blocks) > 1:
            blocks.append(blocks[-1])
        original(self, blocks)

    def touch(self: Any, blocks: Any) -> None:
        for b in blocks:
            b.ref_cnt += 1  # never removed from the free queue

    def get_computed_blocks(self: Any, request: Any) -> Any:
        hit, n, ext = original(self, request)
        if len(hit.blocks[0]) > 1:
            hit = type(hit)((list(reversed(hit.blocks[0])), *hit.blocks[1:]))
        return hit, n, ext

    patch = {
        "free_blocks": free_blocks,
        "touch": touch,
        "get_computed_blocks": get_computed_blocks,
    }[name]
    setattr(target, name, patch)
    try:
        yield
    finally:
        setattr(target, name, original)


def machine(num_blocks: int, block_size: int, chunk: int, lookahead: int, stats: Stats) -> Any:
    """The RuleBasedStateMachine class for these knobs."""
    hypothesis_module()
    import torch  # type: ignore[import-not-found]  # the engines venv has it
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1 import kv_cache_interface as spec_mod
    from vllm.v1.core import kv_cache_manager, kv_cache_utils
    from vllm.v1.request import Request

    from ..engines import vllm as capture_mod

    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(block_size, sha256)

    class VLLMMachine(RuleBasedStateMachine):
        last: ClassVar[list[str]] = []  # the schedule of the example running now

        @initialize()
        def start(self) -> None:
            spec = spec_mod.FullAttentionSpec(
                block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16
            )
            config = spec_mod.KVCacheConfig(
                num_blocks=num_blocks,
                kv_cache_tensors=[],
                kv_cache_groups=[spec_mod.KVCacheGroupSpec(["l0"], spec)],
            )
            self.m = kv_cache_manager.KVCacheManager(
                config,
                max_model_len=4096,
                scheduler_block_size=block_size,
                hash_block_size=block_size,
                enable_caching=True,
            )
            self.requests: dict[str, Any] = {}
            self.running: list[str] = []
            self.waiting: list[str] = []
            self.prompts: list[list[int]] = []
            self.n = 0
            self.sampled = 0
            stats.examples += 1
            type(self).last = []

        def _log(self, text: str) -> None:
            type(self).last.append(text)

        def _sample(self, r: Any) -> None:
            if r.num_computed_tokens == r.num_tokens:
                self.sampled += 1
                r.append_output_token_ids(7000 + self.sampled)

        def _schedule(self, rid: str) -> bool:
            r = self.requests[rid]
            hit, num_hit, _ = engine_call(stats, self.m.get_computed_blocks, r)
            if num_hit:
                stats.counts["prefix hits"] += 1
            todo = min(chunk, r.num_tokens - num_hit) if chunk else r.num_tokens - num_hit
            new = engine_call(
                stats, self.m.allocate_slots, r, todo, num_hit, hit, num_lookahead_tokens=lookahead
            )
            if new is None:
                engine_call(stats, self.m.free, r)
                stats.counts["no room"] += 1
                return False
            r.num_computed_tokens = num_hit + todo
            self._sample(r)
            return True

        @rule(share=st.integers(0, 64), extra=st.integers(1, 3 * block_size))
        def new_request(self, share: int, extra: int) -> None:
            base = self.prompts[share % len(self.prompts)] if self.prompts and share else []
            prompt = base[:share] + [1000 + self.n * 50 + i for i in range(extra)]
            rid = f"r{self.n}"
            self.n += 1
            self.prompts.append(prompt)
            self.requests[rid] = Request(
                rid, prompt, SamplingParams(max_tokens=64), None, block_hasher=hasher
            )
            self._log(f"new {rid} prompt {len(prompt)} tokens sharing {min(share, len(base))}")
            if self._schedule(rid):
                self.running.append(rid)
            else:
                self.waiting.append(rid)

        @rule(pick=st.integers(0, 63))
        def step(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running[pick % len(self.running)]
            r = self.requests[rid]
            todo = r.num_tokens - r.num_computed_tokens
            todo = min(chunk, todo) if chunk else todo
            self._log(f"step {rid} ({todo} tokens)")
            if (
                engine_call(stats, self.m.allocate_slots, r, todo, num_lookahead_tokens=lookahead)
                is None
            ):
                stats.counts["no room"] += 1
                return
            stats.counts["decodes" if todo == 1 else "prefill chunks"] += 1
            r.num_computed_tokens += todo
            self._sample(r)

        @rule(pick=st.integers(0, 63))
        def finish(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running.pop(pick % len(self.running))
            self._log(f"finish {rid}")
            engine_call(stats, self.m.free, self.requests.pop(rid))
            stats.counts["finished"] += 1

        @rule(pick=st.integers(0, 63))
        def preempt(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running.pop(pick % len(self.running))
            self._log(f"preempt {rid}")
            engine_call(stats, self.m.free, self.requests[rid])
            self.requests[rid].num_computed_tokens = 0
            self.waiting.append(rid)
            stats.counts["preemptions"] += 1

        @rule(pick=st.integers(0, 63))
        def resume(self, pick: int) -> None:
            if not self.waiting:
                return
            rid = self.waiting[pick % len(self.waiting)]
            self._log(f"resume {rid}")
            if self._schedule(rid):
                self.waiting.remove(rid)
                self.running.append(rid)
                stats.counts["resumed"] += 1

        @rule()
        def reset_prefix_cache(self) -> None:
            self._log("reset prefix cache")
            if engine_call(stats, self.m.reset_prefix_cache):
                stats.counts["prefix cache resets"] += 1

        @invariant()
        def consistent(self) -> None:
            if not hasattr(self, "m"):
                return
            running = {rid: self.requests[rid] for rid in self.running}
            check(lambda: capture_mod.capture(self.m, running), stats)

    return VLLMMachine


def fuzz(
    examples: int,
    steps: int,
    seconds: float,
    seed: int,
    plant: str | None = None,
    num_blocks: int = 16,
    block_size: int = 4,
    chunk: int = 0,
    lookahead: int = 0,
) -> Outcome:
    """Fuzz vLLM's KVCacheManager; with ``plant`` one of PLANTS patched in."""
    stats = Stats()
    cls = machine(num_blocks, block_size, chunk, lookahead, stats)
    with planted(plant):
        return run(cls, examples, steps, seconds, seed, stats)
