"""The KV-cache kinds ``fuzz sglang`` builds beside its plain paged cache (fuzz/sglang.py):
``swa``, SGLang's sliding-window hybrid cache (an ``SWAKVPool`` of a full-attention and a
sliding-window layer, its ``SWATokenToKVPoolAllocator`` and a ``UnifiedRadixCache`` of the
FULL and SWA components, 0.5.21 and 0.5.23), driven through the scheduler's own paths: real
``Req``s matched in the radix cache and locked as ``PrefillAdder`` locks them, real
``ScheduleBatch``es whose ``prepare_for_extend`` / ``prepare_for_decode`` allocate (the
decode's ``alloc_for_decode`` calls ``maybe_evict_swa``, which frees each request's SWA
pages that left its window), ``release_kv_cache`` for a finished request and
``release_req`` for a retracted one, the tree's ``evict`` when a pool is short, and its
``reset`` (``flush_cache``). Only the model forward is missing: a step's sampled token is
made up.

A step of the machine decodes the whole running batch, as the scheduler does: prompts
are prefilled whole (no chunk, no lookahead)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import types
import warnings
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .core import Stats, engine_call
from .machine import base_machine

KINDS = {
    "full": "the paged allocator and RadixCache",
    "swa": "the sliding-window allocator and UnifiedRadixCache(FULL, SWA)",
    "mamba": "HybridReqToTokenPool's state slots, a token allocator and "
    "UnifiedRadixCache(FULL, MAMBA)",
    "pure_swa": "the all-sliding-window allocator (PureSWATokenToKVPoolAllocator) and "
    "PureSWARadixCache",
}
# the kinds a plant can be found in (the method it patches is on their path)
PLANT_KINDS = {
    # PagedTokenToKVPoolAllocator.free, RadixCache.inc_lock_ref: the SWA allocator frees its
    # pools' pages by id (free_page_ids) and the unified tree locks its own way
    "double_free": ("full",),
    "leak_page": ("full",),
    "lock_once": ("full",),
    "swa_free_inside_window": ("swa", "pure_swa"),
}
# the kinds whose window frees a request's pages as it decodes
WINDOWED = ("swa", "pure_swa")
WINDOW_PAGES = 2  # SGLang's sliding_window_size, in pages
# pure_swa's sliding_window_size, in tokens (page size 1): SGLang keeps a token more than
# the window and frees at least a token behind it, so the plant's window two tokens short
# reaches inside a window of 3 (and not one of 2: a window shorter than a token is one)
PURE_WINDOW = 3
MAMBA_SLOTS = 8  # a schedule runs a few requests at a time: the tree's states get evicted
ROWS = 32
MAX_CONTEXT = 2048
# a tiny Llama's config.json, which SGLang's ServerArgs reads (no weights are loaded)
TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


@contextlib.contextmanager
def configured(page_size: int) -> Iterator[None]:
    """SGLang's process-wide configuration for the run (its scheduler's ``ServerArgs``,
    published: the torch-native attention backend on the CPU, this page size), and
    ``SGLANG_SWA_EVICTION_INTERVAL=1`` so that a window drops its pages as soon as they
    leave it (SGLang's default waits for 128 tokens); the variable as it was after."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    before = os.environ.get("SGLANG_SWA_EVICTION_INTERVAL")
    os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = "1"
    try:
        with tempfile.TemporaryDirectory(prefix="pagedkv-fuzz-sglang-") as model:
            (Path(model) / "config.json").write_text(json.dumps(TINY_MODEL))
            args = ServerArgs(
                model_path=model,
                device="cpu",
                attention_backend="torch_native",
                page_size=page_size,
                skip_tokenizer_init=True,
            )
            runtime_context.publish(args, role="scheduler")
        yield
    finally:
        if before is None:
            os.environ.pop("SGLANG_SWA_EVICTION_INTERVAL", None)
        else:
            os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = before


@contextlib.contextmanager
def planted(bug: str) -> Iterator[None]:
    """``swa_free_inside_window``: the window measured one page short (two tokens at page
    size 1: one would only free the token the window has just let go) in
    ``free_swa_out_of_window_slots``, so that a request's SWA page still inside its window
    is freed."""
    from sglang.srt.mem_cache import common

    original = common.free_swa_out_of_window_slots

    def short(req: Any, pre_len: int, *, sliding_window_size: int, **kw: Any) -> Any:
        window = max(0, sliding_window_size - max(2, int(kw["page_size"])))
        return original(req, pre_len, sliding_window_size=window, **kw)

    common.free_swa_out_of_window_slots = short
    try:
        yield
    finally:
        common.free_swa_out_of_window_slots = original


def unified_tree(rtt: Any, allocator: Any, page_size: int, *components: str, **params: Any) -> Any:
    """A ``UnifiedRadixCache`` of the FULL component and ``components`` (by name) over the
    request rows and the allocator."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    kinds = (ComponentType.FULL, *(ComponentType[c] for c in components))
    return UnifiedRadixCache(
        init_params(rtt, allocator, page_size, tree_components=kinds, **params)
    )


def init_params(rtt: Any, allocator: Any, page_size: int, **params: Any) -> Any:
    """The ``CacheInitParams`` of a radix cache over the request rows and the allocator."""
    from sglang.srt.mem_cache import cache_init_params

    return cache_init_params.CacheInitParams(
        disable=False,
        req_to_token_pool=rtt,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        **params,
    )


def flush(p: Any, call: Any = None) -> None:
    """``flush_cache``: the tree, the request rows and the pools emptied."""
    for fn in (p.tree.reset, p.rtt.clear, p.allocator.clear):
        fn() if call is None else call(fn)


def swa_pools(num_pages: int, page_size: int, swa_pages: int | None = None) -> Any:
    """The sliding-window pools: ``num_pages`` pages of full attention and ``swa_pages``
    (as many by default) of the window's layer, request rows and the unified radix tree
    (a window of WINDOW_PAGES pages)."""
    import torch  # type: ignore[import-not-found]  # the engines venv has it
    from sglang.srt.mem_cache import memory_pool, swa_memory_pool
    from sglang.srt.mem_cache.allocator import swa

    size = num_pages * page_size
    size_swa = (num_pages if swa_pages is None else swa_pages) * page_size
    kv = swa_memory_pool.SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=torch.float16,
        head_num=2,
        head_dim=8,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    allocator = swa.SWATokenToKVPoolAllocator(
        size, size_swa, page_size, torch.float16, "cpu", kv, need_sort=False
    )
    rtt = memory_pool.ReqToTokenPool(
        size=ROWS, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False
    )
    window = WINDOW_PAGES * page_size
    tree = unified_tree(rtt, allocator, page_size, "SWA", sliding_window_size=window)
    return types.SimpleNamespace(kind="swa", kv=kv, allocator=allocator, rtt=rtt, tree=tree)


def pure_swa_pools(num_pages: int, page_size: int = 1) -> Any:
    """The all-sliding-window pools: an ``SWAKVPool`` of one sliding-window layer and no
    full-attention one, its ``PureSWATokenToKVPoolAllocator`` (``num_pages`` slots: SGLang
    takes page size 1 only), request rows and a ``PureSWARadixCache`` (a window of
    PURE_WINDOW tokens)."""
    import torch
    from sglang.srt.mem_cache import memory_pool, swa_memory_pool
    from sglang.srt.mem_cache.allocator import swa
    from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache

    kv = swa_memory_pool.SWAKVPool(
        size=0,
        size_swa=num_pages * page_size,
        page_size=page_size,
        dtype=torch.float16,
        head_num=2,
        head_dim=8,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[],
        device="cpu",
    )
    allocator = swa.PureSWATokenToKVPoolAllocator(
        num_pages * page_size, page_size, torch.float16, "cpu", kv, need_sort=False
    )
    rtt = memory_pool.ReqToTokenPool(
        size=ROWS, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False
    )
    tree = PureSWARadixCache(
        init_params(rtt, allocator, page_size, sliding_window_size=PURE_WINDOW)
    )
    return types.SimpleNamespace(kind="pure_swa", kv=kv, allocator=allocator, rtt=rtt, tree=tree)


def mamba_pools(num_pages: int, page_size: int, slots: int = MAMBA_SLOTS) -> Any:
    """The Mamba hybrid pools: ``slots`` state slots (a Mamba-2 layer) in request rows,
    ``num_pages`` pages of the full-attention layer, the unified radix tree (page size 1:
    SGLang's MambaComponent requires it without its extra buffer)."""
    import torch
    from sglang.srt.configs import mamba_utils
    from sglang.srt.mem_cache import memory_pool
    from sglang.srt.mem_cache.allocator import token

    shape = mamba_utils.Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=64,
        n_groups=1,
        num_heads=2,
        head_dim=32,
        state_size=8,
        conv_kernel=4,
    )
    rtt = memory_pool.HybridReqToTokenPool(
        size=ROWS,
        mamba_size=slots,
        mamba_spec_state_size=slots,
        max_context_len=MAX_CONTEXT,
        device="cpu",
        enable_memory_saver=False,
        cache_params=mamba_utils.Mamba2CacheParams(shape=shape, layers=[0]),
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False,
    )
    size = num_pages * page_size
    kv = memory_pool.HybridLinearKVPool(
        size=size,
        dtype=torch.float16,
        page_size=page_size,
        head_num=2,
        head_dim=8,
        full_attention_layer_ids=[1],
        device="cpu",
        mamba_pool=rtt.mamba_pool,
    )
    allocator = token.TokenToKVPoolAllocator(size, torch.float16, "cpu", kv, False)
    tree = unified_tree(rtt, allocator, page_size, "MAMBA")
    return types.SimpleNamespace(kind="mamba", kv=kv, allocator=allocator, rtt=rtt, tree=tree)


def batch_machine(kind: str, num_pages: int, page_size: int, stats: Stats) -> Any:
    """The machine class of the ``swa``, ``pure_swa`` or ``mamba`` cache."""
    import inspect

    from hypothesis import strategies as st
    from hypothesis.stateful import initialize, rule
    from sglang.srt.managers import schedule_batch
    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from ..engines import sglang as capture_mod

    base = base_machine(stats, page_size, 0)
    checkpoint = "checkpoint" in inspect.signature(common.release_kv_cache).parameters
    model_config = types.SimpleNamespace(vocab_size=512, is_encoder_decoder=False)

    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return engine_call(stats, fn, *args, **kwargs)

    built: list[Any] = []  # the pools, built once a run (an example starts them flushed)

    builders: dict[str, Callable[[int, int], Any]] = {
        "swa": swa_pools,
        "pure_swa": pure_swa_pools,
        "mamba": mamba_pools,
    }
    build = builders[kind]

    class BatchMachine(base):  # type: ignore[misc,valid-type]
        @initialize()
        def start(self) -> None:
            if built:  # the pools of the last example, flushed (as flush_cache does)
                self.p = built[0]
                flush(self.p)
            else:
                with warnings.catch_warnings():  # the engine's notices of a CPU build
                    warnings.simplefilter("ignore")
                    built.append(build(num_pages, page_size))
                self.p = built[0]
            self.batch: Any = None
            self.reqs: dict[str, Any] = {}
            self.prompt: dict[str, list[int]] = {}
            self.sampled = 0
            self.begin()

        def capture(self) -> Any:
            live = list(self.batch.reqs) if self.batch is not None else []
            return capture_mod.capture(self.p.rtt, self.p.allocator, self.p.tree, reqs=live)

        def unreplayable(self) -> str | None:
            if kind == "swa":
                return (
                    "its sliding-window cache has a second pool and a full-to-SWA mapping, "
                    "which a step log does not carry"
                )
            if kind == "pure_swa":
                return "it writes no step log of SGLang's window frees"
            return "its Mamba state slots are a second pool, which a step log does not carry"

        def _free(self) -> int:
            a = self.p.allocator
            if kind in WINDOWED:
                return int(min(a.full_available_size(), a.swa_available_size()))
            return int(a.available_size())

        def _evict_for(self, tokens: int, states: int = 0) -> None:
            params = (
                bpc.EvictParams(num_tokens=tokens, swa_num_tokens=tokens)
                if kind in WINDOWED
                else bpc.EvictParams(num_tokens=tokens, mamba_num=states)
            )
            out = call(self.p.tree.evict, params)
            if any(int(getattr(out, f)) for f in ("num_tokens_evicted", "mamba_num_evicted")):
                stats.counts["evictions"] += 1

        def _room(self, tokens: int, states: int = 0) -> bool:
            """Whether the pools have ``tokens`` more slots (in pages) and ``states`` more
            Mamba state slots, evicting cached prefixes if need be."""
            need = -(-tokens // page_size) * page_size
            short = kind == "mamba" and self.p.rtt.mamba_allocator.available_size() < states
            if self._free() < need or short:
                self._evict_for(need, states)
            if kind == "mamba" and self.p.rtt.mamba_allocator.available_size() < states:
                return False
            return self._free() >= need

        def _batch(self, reqs: list[Any]) -> Any:
            return schedule_batch.ScheduleBatch.init_new(
                reqs,
                self.p.rtt,
                self.p.allocator,
                self.p.tree,
                model_config,
                False,
                SpeculativeAlgorithm.NONE,
            )

        def _sample(self, req: Any) -> None:
            self.sampled += 1
            req.output_ids.append((7000 + self.sampled) % 500)  # as the prompts: < 500

        def _keep(self, rid: str) -> tuple[Any, list[int]]:
            reqs = self.batch.reqs
            keep = [i for i, r in enumerate(reqs) if r.rid != rid]
            return next(r for r in reqs if r.rid == rid), keep

        def add(self, rid: str, prompt: list[int]) -> None:
            self.prompt[rid] = [t % 500 for t in prompt]

        def schedule(self, rid: str) -> bool:
            req = self.reqs.get(rid)
            if req is None:
                params = SamplingParams(max_new_tokens=MAX_CONTEXT)
                req = schedule_batch.Req(rid, "", array("q", self.prompt[rid]), params)
            tokens = len(req.origin_input_ids) + len(req.output_ids)
            if not self.p.rtt.available_size() or not self._room(tokens + page_size, 1):
                stats.counts["no room"] += 1
                return False
            self.reqs[rid] = req
            tree = self.p.tree
            call(req.init_next_round_input, tree)
            if hasattr(tree, "lock"):  # 0.5.23: PrefillAdder's TreeLock
                req.lock = call(tree.lock, req.last_node)
            else:
                req.lock_receipt = call(tree.inc_lock_ref, req.last_node).to_dec_params()
            fill = len(req.full_untruncated_fill_ids)
            if hasattr(req, "set_extend_range"):
                hit = len(req.prefix_indices)
                req.set_extend_range(hit, fill)
            else:
                hit = int(req.prefix_len)
                req.extend_end = fill
            batch = self._batch([req])
            call(batch.prepare_for_extend)
            if kind == "pure_swa":  # as the scheduler does for a prefill-aware SWA model
                req.kv.swa_evict_floor = fill
            self._sample(req)
            if hit:
                stats.counts["prefix hits"] += 1
            if self.batch is None or self.batch.is_empty():
                self.batch = batch
            else:
                call(self.batch.merge_batch, batch)
            return True

        def tokens_left(self, rid: str) -> int:
            return 1  # a prompt is prefilled whole when scheduled

        def grow(self, rid: str, todo: int) -> bool:
            """One decode step of the whole running batch."""
            if not self._room(page_size * len(self.batch.reqs)):
                stats.counts["no room"] += 1
                return False
            swa = ComponentType.SWA
            before = sum(int(r.kv.get_evicted_seqlen(swa)) for r in self.batch.reqs)
            call(self.batch.prepare_for_decode)
            after = sum(int(r.kv.get_evicted_seqlen(swa)) for r in self.batch.reqs)
            if kind in WINDOWED:
                stats.counts["window frees"] += (after - before) // page_size
            for req in self.batch.reqs:
                self._sample(req)
            return True

        def finish_request(self, rid: str) -> None:
            req, keep = self._keep(rid)
            req.finished_reason = schedule_batch.FINISH_LENGTH(len(req.output_ids))
            if checkpoint:
                call(common.release_kv_cache, req, self.p.tree, checkpoint=True)
            else:
                call(common.release_kv_cache, req, self.p.tree)
            call(self.batch.filter_batch, keep_indices=keep)
            del self.reqs[rid]
            # a later prompt may share all of it: a Mamba state is cached where a request
            # ended, and a hit needs a prompt through that point
            self.prompts.append([*req.origin_input_ids, *req.output_ids])

        def preempt_request(self, rid: str) -> None:
            req, keep = self._keep(rid)
            index = self.batch.reqs.index(req)
            call(self.batch.release_req, index, len(keep))  # retract_decode's release
            call(self.batch.filter_batch, keep_indices=keep)

        def reset(self) -> bool:
            flush(self.p, call)
            return True

        @rule(pages=st.integers(1, 8))
        def evict(self, pages: int) -> None:
            self._log(f"evict {pages} page(s)", "evict", pages=pages)
            self._evict_for(pages * page_size, 1)

    return BatchMachine
