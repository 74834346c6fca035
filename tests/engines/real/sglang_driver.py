"""Drive the real SGLang 0.5.21 memory pools on the CPU, as its scheduler does for a
paged cache: a request row, page-aligned allocation, the radix cache for prefixes, lock
refs while running, frees when done."""

from __future__ import annotations

from typing import Any

from .conftest import engine_modules

torch, _pool, _paged, _radix, _params, _base = engine_modules(
    "torch",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
)

PAGE_SIZE = 16


class Running:
    """One request: its row, tokens, slots, and the tree node it locks."""

    def __init__(self, rid: str, row: int, tokens: list[int], slots: Any, node: Any) -> None:
        self.rid = rid
        self.row = row
        self.tokens = tokens
        self.slots = slots  # int64 tensor, one slot per allocated position
        self.node = node
        self.prefix_len = 0


class Engine:
    def __init__(self, num_pages: int = 16, rows: int = 8, page_size: int = PAGE_SIZE) -> None:
        size = num_pages * page_size
        self.page_size = page_size
        self.kv = _pool.MHATokenToKVPool(
            size=size,
            page_size=page_size,
            dtype=torch.float16,
            head_num=2,
            head_dim=8,
            layer_num=2,
            device="cpu",
            enable_memory_saver=False,
        )
        self.allocator = _paged.PagedTokenToKVPoolAllocator(
            size, page_size, torch.float16, "cpu", self.kv, need_sort=False
        )
        self.rtt = _pool.ReqToTokenPool(
            size=rows, max_context_len=256, device="cpu", enable_memory_saver=False
        )
        self.tree = _radix.RadixCache(
            _params.CacheInitParams(
                disable=False,
                req_to_token_pool=self.rtt,
                token_to_kv_pool_allocator=self.allocator,
                page_size=page_size,
            )
        )
        self.running: dict[str, Running] = {}

    def schedule(self, rid: str, tokens: list[int]) -> Running:
        """Match the prefix in the radix cache, lock it, allocate pages for the rest,
        write the row."""
        match = self.tree.match_prefix(_base.MatchPrefixParams(key=_radix.RadixKey(tokens)))
        prefix = match.device_indices.to(torch.int64)
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
        return len(match.device_indices)

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
        tree_slots = match.device_indices.to(torch.int64)
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
