"""vLLM's real KVCacheManager over KV-cache groups of every kind it has (full attention,
sliding window, chunked local attention, Mamba), built from specs alone (no model), driven
with a random schedule as its scheduler drives it: prefix-cache lookups, prefill in chunks,
decode, preemption when the pool is full, resumption (another lookup), finish."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
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
WINDOW = 32  # the sliding window and the local-attention chunk, in tokens
_utils.init_none_hash(_hashing.sha256)


def spec(kind: str, block_size: int = BLOCK_SIZE, mamba_mode: str = "align") -> Any:
    """A group's KVCacheSpec: full, sliding, chunked, mamba, or rswa (one vLLM has and
    pagedkv-sql does not model)."""
    attention = dict(block_size=block_size, num_kv_heads=2, head_size=8, dtype=torch.float16)
    if kind == "sliding":
        return _spec.SlidingWindowSpec(**attention, sliding_window=WINDOW)
    if kind == "chunked":
        return _spec.ChunkedLocalAttentionSpec(**attention, attention_chunk_size=WINDOW)
    if kind == "mamba":
        return _spec.MambaSpec(
            block_size=block_size,
            shapes=((4, 8),),
            dtypes=(torch.float16,),
            mamba_cache_mode=mamba_mode,
        )
    if kind == "rswa":
        return _spec.RSWASpec(**attention, rswa_window=WINDOW)
    return _spec.FullAttentionSpec(**attention)


def manager(
    kinds: list[str], num_blocks: int = 40, caching: bool = True, retention: int | None = None
) -> Any:
    """A KVCacheManager of one group a kind (group g's layer: model.layers.g.attn); the
    coordinator vLLM picks for them (Unitary, Hybrid, or NoPrefixCache without caching).
    Mamba without caching ("none" mode) keeps one block of max_model_len tokens.
    `retention`: the config's prefix_cache_retention_interval (None: every block hashed;
    0, vLLM's CacheConfig default: a sliding-window or Mamba group hashes only the blocks a
    later hit can use)."""
    max_model_len = 512
    groups = [
        _spec.KVCacheGroupSpec(
            [f"model.layers.{g}.attn"],
            spec(k, max_model_len, "none") if k == "mamba" and not caching else spec(k),
        )
        for g, k in enumerate(kinds)
    ]
    config = _spec.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=retention,
    )
    return _manager.KVCacheManager(
        config,
        max_model_len=max_model_len,
        # the scheduling granularity: the groups' block sizes' least common multiple
        scheduler_block_size=math.lcm(*(g.kv_cache_spec.block_size for g in groups)),
        hash_block_size=BLOCK_SIZE,
        enable_caching=caching,
        enable_kv_cache_events=True,
    )


@dataclass
class Coverage:
    """What a run went through: prefix-hit tokens, preemptions, placeholders seen behind
    a held block (a window's dropped entries, a hit's padding, Mamba's passed states)."""

    hit_tokens: int = 0
    preemptions: int = 0
    placeholders: int = 0
    finished: int = 0
    steps: int = 0


@dataclass
class Driver:
    """A random schedule over one manager; ``step()`` is one scheduler step."""

    manager: Any
    seed: int = 0
    chunk: int = 40  # prefill tokens a step
    concurrency: int = 5  # requests running or waiting
    # vLLM's scheduler's order: the running requests first, then the waiting (a request
    # scheduled once a step), a finished request freed when the next step starts (vLLM frees
    # it in update_from_output): what a step log's replay requires of a step
    scheduler_order: bool = False
    done: list[Any] = field(default_factory=list)
    running: dict[str, Any] = field(default_factory=dict)
    waiting: list[Any] = field(default_factory=list)
    coverage: Coverage = field(default_factory=Coverage)

    def __post_init__(self) -> None:
        self.rnd = random.Random(self.seed)
        self.hasher = _utils.get_request_block_hasher(BLOCK_SIZE, _hashing.sha256)
        self.prompts: list[list[int]] = []
        self.next_id = 0

    def _prompt(self) -> list[int]:
        """A shared prefix of 1..3 blocks and a tail; an earlier prompt again at times
        (whole blocks: a Mamba group caches its state at a block's end)."""
        if self.prompts and self.rnd.random() < 0.4:  # an earlier prompt, continued
            earlier = self.rnd.choice(self.prompts)
            return earlier + [2000 + self.next_id] * self.rnd.randint(1, 20)
        prefix = list(range(1, 1 + BLOCK_SIZE * self.rnd.randint(1, 3)))
        tail = [1000 + self.next_id] * self.rnd.choice([BLOCK_SIZE, 2 * BLOCK_SIZE, 5, 23])
        self.prompts.append(prefix + tail)
        return prefix + tail

    def admit(self) -> None:
        self.next_id += 1
        r = _request.Request(
            f"r{self.next_id}",
            self._prompt(),
            _sampling.SamplingParams(max_tokens=200),
            None,
            block_hasher=self.hasher,
        )
        self.waiting.append(r)

    def _schedule_waiting(self, r: Any) -> bool:
        m = self.manager
        hit, num_hit, _ = m.get_computed_blocks(r)
        todo = min(self.chunk, r.num_tokens - num_hit)
        if m.allocate_slots(r, todo, num_hit, hit) is None:
            m.free(r)  # nothing held: it waits
            return False
        self.coverage.hit_tokens += num_hit
        r.num_computed_tokens = num_hit + todo
        self.running[r.request_id] = r
        self._sample(r)
        return True

    def _sample(self, r: Any) -> None:
        if r.num_computed_tokens == r.num_tokens:
            r.append_output_token_ids(self.rnd.randint(1, 500))

    def step(self) -> None:
        self.coverage.steps += 1
        self.manager.new_step_starts()  # as Scheduler.schedule: a Mamba block cached in
        # the step before can be a prefix hit now
        for r in self.done:
            self.manager.free(r)
        self.done = []
        if len(self.running) + len(self.waiting) < self.concurrency and self.rnd.random() < 0.6:
            self.admit()
        if not self.scheduler_order:
            self._schedule_all_waiting()
        self._schedule_running()
        if self.scheduler_order:
            self._schedule_all_waiting()

    def _schedule_all_waiting(self) -> None:
        for r in list(self.waiting):
            if self._schedule_waiting(r):
                self.waiting.remove(r)

    def _schedule_running(self) -> None:
        for rid in list(self.running):
            r = self.running[rid]
            todo = min(self.chunk, r.num_tokens - r.num_computed_tokens)
            if self.manager.allocate_slots(r, todo) is None:
                self.preempt(rid)
                continue
            r.num_computed_tokens += todo
            self._sample(r)
            if r.num_output_tokens > self.rnd.randint(8, 60):
                r.status = _request.RequestStatus.FINISHED_STOPPED
                if self.scheduler_order:
                    self.done.append(r)
                else:
                    self.manager.free(r)
                del self.running[rid]
                self.coverage.finished += 1

    def preempt(self, rid: str) -> None:
        """As Scheduler._preempt_request: free the blocks, forget the computed tokens."""
        r = self.running.pop(rid)
        self.manager.free(r)
        r.num_computed_tokens = 0
        r.status = _request.RequestStatus.PREEMPTED
        self.waiting.append(r)
        self.coverage.preemptions += 1

    def run(self, steps: int, each: Callable[[Driver], None]) -> Coverage:
        """``steps`` scheduler steps, ``each(self)`` after every one."""
        for _ in range(steps):
            self.step()
            self.coverage.placeholders += self.placeholders()
            each(self)
        return self.coverage

    def placeholders(self) -> int:
        """Null entries before a held block in the groups' lists."""
        n = 0
        for m in self.manager.coordinator.single_type_managers:
            for blocks in m.req_to_blocks.values():
                ids = [b.block_id for b in blocks]
                last = max((i for i, b in enumerate(ids) if b != 0), default=-1)
                n += sum(1 for b in ids[:last] if b == 0)
        return n

    def group(self, g: int) -> Any:
        return self.manager.coordinator.single_type_managers[g]
