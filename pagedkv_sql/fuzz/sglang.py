"""A hypothesis state machine over SGLang's real paged allocator, ``ReqToTokenPool`` and
``RadixCache`` (0.5.21 and 0.5.23), driven as its scheduler's memory side does: a request
matches its prompt in the radix cache and locks the node, takes a row and pages (evicting
unlocked prefixes when the pool is short), computes its prompt in prefill chunks (each
chunk's whole pages inserted into the tree, the row re-pointed at the tree's copy and the
duplicates freed: ``cache_unfinished_req``), decodes a token a step, finishes (its whole
pages cached, the tail freed, the lock dropped, the row freed: ``cache_finished_req``) or
is retracted (its own pages freed, to be prefilled again); the prefix cache is evicted and
flushed. Planted bugs patch the allocator's ``free`` and the tree's ``inc_lock_ref``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from .. import invariants
from ..errors import UsageError
from . import core, sglang_kinds
from .core import Outcome, Stats, engine_call
from .machine import base_machine

PLANTS = tuple(invariants.plants("sglang"))  # the catalogue's (pagedkv_sql/invariants.py)
ROWS = 32  # ReqToTokenPool rows: more than a schedule of a few dozen steps keeps running
MAX_CONTEXT = 2048

# what a run imports, with what to install when it is missing
REQUIRES = (("sglang.srt.mem_cache.radix_cache", "pip install sglang"),)


@contextlib.contextmanager
def planted(bug: str | None) -> Iterator[None]:
    """Monkeypatch one of SGLang's own methods with a real bug for the run's length:
    ``double_free`` hands the last page of every free back twice, ``leak_page`` drops it,
    ``lock_once`` leaves a second lock on an already locked node uncounted; a plant of a
    KV-cache kind, fuzz/sglang_kinds.py's."""
    if bug is None:
        yield
        return
    if bug == "swa_free_inside_window":
        with sglang_kinds.planted(bug):
            yield
        return
    from sglang.srt.mem_cache import radix_cache
    from sglang.srt.mem_cache.allocator import paged

    target, name = (
        (radix_cache.RadixCache, "inc_lock_ref")
        if bug == "lock_once"
        else (paged.PagedTokenToKVPoolAllocator, "free")
    )
    original = getattr(target, name)

    def free(self: Any, index: Any) -> Any:
        if index.numel() == 0:
            return original(self, index)
        pages = index // self.page_size
        if bug == "leak_page":
            return original(self, index[pages != pages[-1]])
        original(self, index)
        return original(self, index[-1:])  # double_free: the last page once more

    def inc_lock_ref(self: Any, node: Any) -> Any:
        if node.lock_ref > 0:
            return 0  # the second lock is not counted
        return original(self, node)

    setattr(target, name, free if name == "free" else inc_lock_ref)
    try:
        yield
    finally:
        setattr(target, name, original)


def pools(num_pages: int, rows: int, page_size: int, max_context_len: int) -> Any:
    """SGLang's pools for one paged cache, as its scheduler builds them: the K/V buffers
    (``kv``), the page allocator, the request rows (``rtt``) and the radix cache
    (``tree``)."""
    import types

    import torch  # type: ignore[import-not-found]  # the engines venv has it
    from sglang.srt.mem_cache import cache_init_params, memory_pool, radix_cache
    from sglang.srt.mem_cache.allocator import paged

    size = num_pages * page_size
    kv = memory_pool.MHATokenToKVPool(
        size=size,
        page_size=page_size,
        dtype=torch.float16,
        head_num=2,
        head_dim=8,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = paged.PagedTokenToKVPoolAllocator(
        size, page_size, torch.float16, "cpu", kv, need_sort=False
    )
    rtt = memory_pool.ReqToTokenPool(
        size=rows, max_context_len=max_context_len, device="cpu", enable_memory_saver=False
    )
    tree = radix_cache.RadixCache(
        cache_init_params.CacheInitParams(
            disable=False,
            req_to_token_pool=rtt,
            token_to_kv_pool_allocator=allocator,
            page_size=page_size,
        )
    )
    return types.SimpleNamespace(kv=kv, allocator=allocator, rtt=rtt, tree=tree)


def prefix_indices(tree: Any, match: Any) -> Any:
    """A match result's device indices: SGLang 0.5.21's ``device_indices``, or 0.5.23's
    ``device_prefix_len`` with ``tree.path_device_indices(last_device_node)``."""
    if hasattr(match, "device_indices"):
        return match.device_indices
    return tree.path_device_indices(match.last_device_node)[: match.device_prefix_len]


class Req:
    """One request as ``capture`` and the recorder read it (``rid``, ``req_pool_idx``,
    ``kv_allocated_len``), with what the scheduler keeps: its tokens (the prompt and the
    tokens sampled), how many are computed, its slots (whole pages), the node it locks and
    how many of its leading tokens the tree holds (``protected``)."""

    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.rid = rid
        self.tokens = tokens
        self.computed = 0
        self.req_pool_idx: int | None = None
        self.kv_allocated_len = 0
        self.slots: Any = None
        self.node: Any = None
        self.protected = 0
        self.prompt_len = len(tokens)


def machine(
    num_pages: int, page_size: int, chunk: int, lookahead: int, stats: Stats, kind: str = "full"
) -> Any:
    """The machine class for these knobs and KV-cache ``kind`` (sglang_kinds.KINDS)."""
    if kind != "full":
        return sglang_kinds.batch_machine(kind, num_pages, page_size, stats)
    import torch
    from hypothesis import strategies as st
    from hypothesis.stateful import initialize, rule
    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache import radix_cache

    from ..engines import sglang as capture_mod
    from ..replay.record_sglang import Recorder

    base = base_machine(stats, page_size, chunk)
    ps = page_size

    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return engine_call(stats, fn, *args, **kwargs)

    class SGLangMachine(base):  # type: ignore[misc,valid-type]
        @initialize()
        def start(self) -> None:
            self.p = pools(num_pages, ROWS, ps, MAX_CONTEXT)
            self.reqs: dict[str, Req] = {}
            self.sampled = 0
            self.begin()

        def capture(self) -> Any:
            live = [self.reqs[rid] for rid in self.running]
            return capture_mod.capture(self.p.rtt, self.p.allocator, self.p.tree, reqs=live)

        def recorder(self, out: Any) -> Any:
            return Recorder(self.p.rtt, self.p.allocator, out, self.p.tree)

        def end_step(self, recorder: Any) -> None:
            recorder.step(list(self.reqs.values()))

        # -- the scheduler's memory side ---------------------------------------------------
        def _evict(self, tokens: int) -> None:
            out = call(self.p.tree.evict, bpc.EvictParams(num_tokens=tokens))
            if int(out.num_tokens_evicted):
                stats.counts["evictions"] += 1

        def _room(self, slots: int) -> bool:
            """Whether ``slots`` more slots fit, evicting cached prefixes if need be."""
            have = int(self.p.allocator.available_size())
            if have < slots:
                self._evict(slots - have)
            return int(self.p.allocator.available_size()) >= slots

        def _cache(self, r: Req, length: int) -> None:
            """Insert the request's whole computed pages into the tree; the tree's copy of
            what it held already replaces the request's (freed), and the lock moves to the
            new node."""
            length -= length % ps
            if length <= r.protected:
                return
            tree = self.p.tree
            key = radix_cache.RadixKey(r.tokens[:length])
            done = call(tree.insert, bpc.InsertParams(key=key, value=r.slots[:length].clone()))
            call(self.p.allocator.free, r.slots[r.protected : done.prefix_len])
            match = call(tree.match_prefix, bpc.MatchPrefixParams(key=key))
            held = prefix_indices(tree, match).to(torch.int64)
            r.slots = torch.cat([held, r.slots[len(held) :]])
            call(self.p.rtt.write, (r.req_pool_idx, slice(0, len(held))), held.to(torch.int32))
            call(tree.inc_lock_ref, match.last_device_node)
            call(tree.dec_lock_ref, r.node)
            r.node, r.protected = match.last_device_node, len(held)

        def _release(self, r: Req) -> None:
            """Free the request's pages past the tree's, drop its lock, free its row."""
            call(self.p.allocator.free, r.slots[r.protected :])
            call(self.p.tree.dec_lock_ref, r.node)
            call(self.p.rtt.free_rows, [r.req_pool_idx])
            r.req_pool_idx, r.node, r.slots = None, None, None
            r.computed = r.kv_allocated_len = r.protected = 0

        # -- the rules' engine side --------------------------------------------------------
        def add(self, rid: str, prompt: list[int]) -> None:
            self.reqs[rid] = Req(rid, prompt)

        def schedule(self, rid: str) -> bool:
            """Match the prompt in the radix cache, lock it, take a row and compute the
            first chunk; undone when the pool has no room."""
            r = self.reqs[rid]
            key = radix_cache.RadixKey(r.tokens[: len(r.tokens) - 1])
            match = call(self.p.tree.match_prefix, bpc.MatchPrefixParams(key=key))
            prefix = prefix_indices(self.p.tree, match).to(torch.int64)
            rows = call(self.p.rtt.alloc_rows, 1) if self.p.rtt.free_slots else None
            if not rows:
                stats.counts["no room"] += 1
                return False
            r.req_pool_idx = int(rows[0])
            call(self.p.tree.inc_lock_ref, match.last_device_node)
            r.node, r.slots = match.last_device_node, prefix
            r.computed = r.kv_allocated_len = r.protected = len(prefix)
            r.prompt_len = len(r.tokens)  # a retracted request computes its output again
            call(self.p.rtt.write, (r.req_pool_idx, slice(0, len(prefix))), prefix.to(torch.int32))
            if not self.grow(rid, self.todo(rid)):
                self._release(r)
                return False
            if len(prefix):
                stats.counts["prefix hits"] += 1
            return True

        def tokens_left(self, rid: str) -> int:
            r = self.reqs[rid]
            return len(r.tokens) - r.computed

        def grow(self, rid: str, todo: int) -> bool:
            """Slots for ``todo`` more tokens (and the lookahead) in the request's row;
            compute them, sample when the prompt is done; after a prefill chunk, cache its
            whole pages (``cache_unfinished_req``). False when there is no room."""
            r = self.reqs[rid]
            want = r.computed + todo + lookahead
            missing = -(-max(0, want - len(r.slots)) // ps) * ps
            if missing:
                if not self._room(missing):
                    stats.counts["no room"] += 1
                    return False
                fresh = call(self.p.allocator.alloc, missing)
                r.slots = torch.cat([r.slots, fresh.to(torch.int64)])
            start = r.kv_allocated_len
            r.kv_allocated_len = want
            where = (r.req_pool_idx, slice(start, want))
            call(self.p.rtt.write, where, r.slots[start:want].to(torch.int32))
            prefill = r.computed < r.prompt_len
            r.computed += todo
            if r.computed == len(r.tokens):
                self.sampled += 1
                r.tokens.append(7000 + self.sampled)
            if prefill:
                self._cache(r, r.computed)
            return True

        def finish_request(self, rid: str) -> None:
            r = self.reqs.pop(rid)
            self._cache(r, r.computed)  # cache_finished_req
            self._release(r)  # the tree holds its whole pages now

        def preempt_request(self, rid: str) -> None:
            self._release(self.reqs[rid])  # retract_decode: its own pages freed

        def reset(self) -> bool:
            sglang_kinds.flush(self.p, call)  # flush_cache: the tree, the rows, the free list
            return True

        @rule(pages=st.integers(1, 8))
        def evict(self, pages: int) -> None:
            self._log(f"evict {pages} page(s)", "evict", pages=pages)
            self._evict(pages * ps)

    return SGLangMachine


def fuzz(
    examples: int | None,
    steps: int,
    seconds: float,
    seed: int,
    kind: str = "full",
    **knobs: Any,
) -> Outcome:
    """Fuzz SGLang's allocator, request rows and radix cache of KV-cache ``kind``
    (sglang_kinds.KINDS; ``core.fuzz``: ``plant`` one of PLANTS, the knobs, ``log``;
    ``num_blocks`` pages of ``block_size`` tokens)."""
    if kind not in sglang_kinds.KINDS:
        raise UsageError(
            f"no KV-cache kind {kind!r}", hint=f"one of {', '.join(sglang_kinds.KINDS)}"
        )
    plant = knobs.get("plant")
    kinds = sglang_kinds.PLANT_KINDS.get(plant or "", sglang_kinds.KINDS)
    if kind not in kinds:
        raise UsageError(
            f"--plant {plant} mutates what the {' and '.join(kinds)} "
            f"{'cache calls' if len(kinds) == 1 else 'caches call'}, which "
            f"--kind {kind} never calls: nothing was run",
            hint=" or ".join(f"--kind {k}" for k in kinds),
        )
    if kind == "full":
        return core.fuzz(sys.modules[__name__], examples, steps, seconds, seed, **knobs)
    if knobs.get("chunk") or knobs.get("lookahead"):
        raise UsageError(
            f"--kind {kind} prefills whole prompts and decodes the running batch, as "
            "SGLang's ScheduleBatch does: --chunk and --lookahead are not modelled; "
            "nothing was run",
            hint="leave out --chunk and --lookahead",
        )
    page_size = int(knobs.get("block_size", 4))
    why = {
        "mamba": "SGLang's MambaComponent requires page size 1 without its extra buffer",
        "pure_swa": "SGLang's PureSWATokenToKVPoolAllocator takes page size 1 only",
    }
    if kind in why and page_size != 1:
        raise UsageError(
            f"--kind {kind} takes --block-size 1, not {page_size}: {why[kind]}; nothing was run",
            hint=f"--kind {kind} --block-size 1 (and a pool of some 64 pages)",
        )
    core.hypothesis_module()
    core.require("sglang.srt.mem_cache.unified_radix_cache", "pip install sglang")
    with sglang_kinds.configured(page_size):
        return core.fuzz(sys.modules[__name__], examples, steps, seconds, seed, kind=kind, **knobs)
