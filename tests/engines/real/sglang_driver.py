"""Drive SGLang 0.5.21's memory pools on the CPU.

``Scheduler`` takes the scheduler's own paths: real ``Req``s matched in the radix cache
(``init_next_round_input``) and locked as ``PrefillAdder`` locks them, real
``ScheduleBatch``es whose ``prepare_for_extend`` / ``prepare_for_decode`` allocate with
``alloc_for_extend`` / ``alloc_for_decode`` (the allocator's ``alloc_extend`` /
``alloc_decode``: Triton kernels, run by Triton's interpreter, see conftest.py),
``release_kv_cache`` for a finished request, ``filter_batch`` / ``merge_batch`` and
``retract_decode``. Only the model forward is missing: each step's sampled token is made
up. ``Engine`` drives the pools by hand (``alloc``, ``write``) for the capture tests.

SGLang reads its configuration from a published ``ServerArgs``: a tiny Llama
``config.json`` (no weights) is written for it, with the torch-native attention backend."""

from __future__ import annotations

import inspect
import json
import tempfile
import types
from array import array
from pathlib import Path
from typing import Any

from pagedkv_sql.fuzz.sglang import pools, prefix_indices
from pagedkv_sql.fuzz.sglang_kinds import TINY_MODEL

from .helpers import engine_modules

(torch, _radix, _base, _sb, _common, _sampling, _spec, _rc, _args) = engine_modules(
    "torch",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache.common",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
)

PAGE_SIZE = 16
TINY_LLAMA = {**TINY_MODEL, "max_position_embeddings": 512}
_published: list[Path] = []


def publish(page_size: int = PAGE_SIZE) -> None:
    """Install SGLang's process-wide configuration once (the scheduler's role)."""
    if _published:
        return
    model = Path(tempfile.mkdtemp(prefix="pagedkv-sglang-model-"))
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    args = _args.ServerArgs(
        model_path=str(model),
        device="cpu",
        attention_backend="torch_native",
        page_size=page_size,
        skip_tokenizer_init=True,
    )
    _rc.publish(args, role="scheduler")
    _published.append(model)


class Running:
    """One request: its row, tokens, slots, and the tree node it locks."""

    def __init__(self, rid: str, row: int, tokens: list[int], slots: Any, node: Any) -> None:
        self.rid = rid
        self.row = row
        self.tokens = tokens
        self.slots = slots  # int64 tensor, one slot per allocated position
        self.node = node
        self.prefix_len = 0


class Pools:
    """SGLang's pools for one paged cache (built by the fuzzer's ``pools``): K/V buffers,
    the page allocator, the request rows and the radix cache."""

    def __init__(self, num_pages: int, rows: int, page_size: int, max_context_len: int) -> None:
        self.page_size = page_size
        built = pools(num_pages, rows, page_size, max_context_len)
        self.kv, self.allocator, self.rtt, self.tree = (
            built.kv,
            built.allocator,
            built.rtt,
            built.tree,
        )


class Engine(Pools):
    """The pools driven by hand (the capture tests): ``alloc`` and ``write`` called here,
    not on the scheduler's path; ``Scheduler`` below takes that path."""

    def __init__(self, num_pages: int = 16, rows: int = 8, page_size: int = PAGE_SIZE) -> None:
        super().__init__(num_pages, rows, page_size, 256)
        self.running: dict[str, Running] = {}

    def schedule(self, rid: str, tokens: list[int]) -> Running:
        """Match the prefix in the radix cache, lock it, allocate pages for the rest,
        write the row."""
        match = self.tree.match_prefix(_base.MatchPrefixParams(key=_radix.RadixKey(tokens)))
        prefix = prefix_indices(self.tree, match).to(torch.int64)
        self.tree.inc_lock_ref(match.last_device_node)
        row = self.rtt.alloc_rows(1)[0]
        need = len(tokens) - len(prefix)
        pages = -(-need // self.page_size)
        fresh = self.allocator.alloc(pages * self.page_size)
        assert fresh is not None, f"no room for {rid}"
        slots = torch.cat([prefix, fresh])
        self.rtt.write((row, slice(0, len(tokens))), slots[: len(tokens)].to(torch.int32))
        r = Running(rid, row, list(tokens), slots, match.last_device_node)
        r.prefix_len = len(prefix)
        self.running[rid] = r
        return r

    def decode(self, rid: str, token: int) -> None:
        """One more token: the next slot of the last page, or a new page."""
        r = self.running[rid]
        pos = len(r.tokens)
        if pos == len(r.slots):
            page = self.allocator.alloc(self.page_size)
            assert page is not None
            r.slots = torch.cat([r.slots, page])
        self.rtt.write((r.row, slice(pos, pos + 1)), r.slots[pos : pos + 1].to(torch.int32))
        r.tokens.append(token)

    def cache_prefix(self, rid: str, length: int) -> None:
        """Insert the request's first ``length`` tokens (whole pages) into the radix cache,
        as cache_unfinished_req does, and move its lock to the new node."""
        r = self.running[rid]
        key = _radix.RadixKey(r.tokens[:length])
        self.tree.insert(_base.InsertParams(key=key, value=r.slots[:length].clone()))
        match = self.tree.match_prefix(_base.MatchPrefixParams(key=key))
        self.tree.dec_lock_ref(r.node)
        self.tree.inc_lock_ref(match.last_device_node)
        r.node = match.last_device_node

    def finish(self, rid: str) -> None:
        """Free what the tree does not hold, unlock the prefix, free the row."""
        r = self.running.pop(rid)
        cached = self.tree_len(r)
        self.allocator.free(r.slots[cached:])
        self.tree.dec_lock_ref(r.node)
        self.rtt.free_rows([r.row])

    def tree_len(self, r: Running) -> int:
        match = self.tree.match_prefix(_base.MatchPrefixParams(key=_radix.RadixKey(r.tokens)))
        return len(prefix_indices(self.tree, match))

    def seq_lens(self) -> dict[int, int]:
        return {r.row: len(r.tokens) for r in self.running.values()}

    def request_ids(self) -> dict[int, str]:
        return {r.row: r.rid for r in self.running.values()}


class Scheduler(Engine):
    """The radix cache as SGLang's scheduler keeps it (radix_cache.py _insert_cache,
    cache_unfinished_req, cache_finished_req): inserting a request's whole pages frees the
    duplicates the tree already held and points the row at the tree's slots; finishing
    frees the tail past the last whole page; eviction frees unlocked leaves."""

    def protected(self, r: Running) -> int:
        return getattr(r, "protected", r.prefix_len)

    def cache_prefix(self, rid: str, length: int) -> None:
        r = self.running[rid]
        length -= length % self.page_size
        if length <= self.protected(r):
            return
        key = _radix.RadixKey(r.tokens[:length])
        result = self.tree.insert(_base.InsertParams(key=key, value=r.slots[:length].clone()))
        self.allocator.free(r.slots[self.protected(r) : result.prefix_len])  # duplicates
        match = self.tree.match_prefix(_base.MatchPrefixParams(key=key))
        tree_slots = prefix_indices(self.tree, match).to(torch.int64)
        r.slots = torch.cat([tree_slots, r.slots[len(tree_slots) :]])
        self.rtt.write((r.row, slice(0, len(tree_slots))), tree_slots.to(torch.int32))
        self.tree.inc_lock_ref(match.last_device_node)
        self.tree.dec_lock_ref(r.node)
        r.node = match.last_device_node
        r.protected = len(tree_slots)  # type: ignore[attr-defined]

    def finish(self, rid: str) -> None:
        r = self.running[rid]
        whole = len(r.tokens) - len(r.tokens) % self.page_size
        self.cache_prefix(rid, whole)
        r = self.running.pop(rid)
        self.allocator.free(r.slots[max(whole, self.protected(r)) :])  # the tail
        self.tree.dec_lock_ref(r.node)
        self.rtt.free_rows([r.row])

    def evict(self, num_tokens: int) -> int:
        return int(self.tree.evict(_base.EvictParams(num_tokens=num_tokens)).num_tokens_evicted)

    def room(self, tokens: int) -> bool:
        """Whether ``tokens`` more slots fit, evicting cached prefixes if need be."""
        need = -(-tokens // self.page_size) * self.page_size
        if self.allocator.available_size() < need:
            self.evict(need - self.allocator.available_size())
        return bool(self.allocator.available_size() >= need)


class BatchScheduler(Pools):
    """The scheduler's memory side: one running decode batch, requests admitted into it
    through prefill batches, finished and retracted as the scheduler does."""

    def __init__(self, num_pages: int = 16, rows: int = 8, page_size: int = PAGE_SIZE) -> None:
        publish(page_size)
        super().__init__(num_pages, rows, page_size, 512)
        self.model_config = types.SimpleNamespace(vocab_size=512, is_encoder_decoder=False)
        self.running: Any = None  # the decode batch
        self.retracted: list[Any] = []

    def _batch(self, reqs: list[Any]) -> Any:
        return _sb.ScheduleBatch.init_new(
            reqs,
            self.rtt,
            self.allocator,
            self.tree,
            self.model_config,
            False,
            _spec.SpeculativeAlgorithm.NONE,
        )

    def prefill(self, *prompts: tuple[str, list[int]]) -> list[Any]:
        """New requests (or retracted ones, by rid) matched in the radix cache, locked,
        and allocated by one prefill batch's ``prepare_for_extend``; then merged into
        the running batch with their first sampled token."""
        reqs = []
        for rid, tokens in prompts:
            req = next((r for r in self.retracted if r.rid == rid), None)
            if req is not None:
                self.retracted.remove(req)
            else:
                params = _sampling.SamplingParams(max_new_tokens=1000)
                req = _sb.Req(rid, "", array("q", tokens), params)
            req.init_next_round_input(self.tree)
            if hasattr(self.tree, "lock"):  # PrefillAdder.add_one_req: 0.5.23's TreeLock
                req.lock = self.tree.lock(req.last_node)
            elif hasattr(self.tree, "tree_core"):  # 0.5.21's UnifiedRadixCache: the receipt
                req.lock_receipt = self.tree.inc_lock_ref(req.last_node).to_dec_params()
            else:
                self.tree.inc_lock_ref(req.last_node)
            if hasattr(req, "set_extend_range"):
                req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))
            else:  # 0.5.23: the round extends [prefix_len, extend_end)
                req.extend_end = len(req.full_untruncated_fill_ids)
            reqs.append(req)
        batch = self._batch(reqs)
        batch.prepare_for_extend()
        for req in reqs:
            req.output_ids.append(1)
        if self.running is None or self.running.is_empty():
            self.running = batch
        else:
            self.running.merge_batch(batch)
        return reqs

    def decode(self) -> None:
        """One decode step of the running batch (``prepare_for_decode``), one token each."""
        self.running.prepare_for_decode()
        for req in self.running.reqs:
            req.output_ids.append(2)

    def finish(self, rid: str) -> None:
        """The request ends: ``release_kv_cache`` (the tree keeps its pages, its lock is
        dropped, its row freed), and the running batch drops it."""
        keep = [i for i, r in enumerate(self.running.reqs) if r.rid != rid]
        (req,) = [r for r in self.running.reqs if r.rid == rid]
        if "checkpoint" in inspect.signature(_common.release_kv_cache).parameters:
            _common.release_kv_cache(req, self.tree, checkpoint=True)  # 0.5.23
        else:
            _common.release_kv_cache(req, self.tree)
        self.running.filter_batch(keep_indices=keep)

    def retract(self) -> list[str]:
        """``retract_decode``: the scheduler's answer to a pool too small for the next
        decode step."""
        retracted, _, aborted = self.running.retract_decode()
        assert not aborted
        self.retracted.extend(retracted)
        return [r.rid for r in retracted]

    def snapshot(self) -> Any:
        """``sglang.capture`` of the pools, given the requests (``reqs``)."""
        from pagedkv_sql.engines import sglang

        return sglang.capture(self.rtt, self.allocator, self.tree, reqs=self.reqs())

    def silent(self) -> None:
        """The fast check of ``snapshot()`` finds nothing."""
        from pagedkv_sql.engines import check_snapshot

        found = check_snapshot(self.snapshot())
        assert found == [], [str(f) for f in found]

    def reqs(self) -> list[Any]:
        """What a step's end reads: the running requests and the retracted ones."""
        running = list(self.running.reqs) if self.running is not None else []
        return running + self.retracted

    def rows(self) -> dict[str, list[int]]:
        """Each running request's slots, read from ``req_to_token``."""
        out = {}
        for req in self.running.reqs:
            row, n = req.kv.req_pool_idx, req.kv.kv_allocated_len
            out[req.rid] = self.rtt.req_to_token[row, :n].to(torch.int64).tolist()
        return out

    # what capture() reads (tests/engines/real/test_sglang.py)
    def seq_lens(self) -> dict[int, int]:
        return {r.kv.req_pool_idx: r.kv.kv_allocated_len for r in self.running.reqs}

    def request_ids(self) -> dict[int, str]:
        return {r.kv.req_pool_idx: r.rid for r in self.running.reqs}


def hit(req: Any) -> int:
    """The tokens a request matched in the radix cache (0.5.21's prefix_indices, 0.5.23's
    prefix_len)."""
    if hasattr(req, "prefix_indices"):
        return len(req.prefix_indices)
    return int(req.prefix_len)
