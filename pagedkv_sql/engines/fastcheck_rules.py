"""The engine invariants of the fast check, one function a ``diag_engine_*`` view of
sql/engines.sql, in the views' order (``CHECKS``), each over the numpy columns of
engines/fastcheck_state.py. Semantics as SQL's: see engines/fastcheck.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..kv_groups import FULL_ATTENTION, TOKEN_KINDS, kept_start
from .fastcheck_state import (
    EMPTY,
    Finding,
    State,
    count,
    div,
    ids_of,
    join,
    mod,
    row_codes,
    rows_of,
    split_ids,
)
from .tables import Pool

# -- the checks, one function a view, in the views' order -----------------------------------
Check = Callable[[State], Iterator[Finding]]


def refcount_mismatch(s: State) -> Iterator[Finding]:
    held = count(s.h_key, s.k_key)
    bad = np.flatnonzero(s.k_has_ref & ~s.k_null & (s.k_ref != held))
    if bad.size == 0:
        return
    rows = rows_of(s.h_key)
    for j in bad.tolist():
        n = int(held[j])
        ids = s.hold_ids(rows.get(int(s.k_key[j]), EMPTY))
        entries = "entry" if n == 1 else "entries"
        yield Finding(
            "diag_engine_refcount_mismatch",
            f"ref_cnt {s.k_ref[j]} but {n} block-list {entries} hold block {s.k_block[j]}",
            split_ids(ids),
            int(s.k_block[j]),
        )


def free_queue_ref_cnt(s: State) -> Iterator[Finding]:
    if s.info.get("free_queue") != "recorded":
        return
    queued = count(s.f_key, s.k_key) > 0
    bad = np.flatnonzero(s.k_has_ref & ~s.k_null & ((s.k_ref == 0) != queued))
    for j in bad.tolist():
        b = s.k_block[j]
        reason = (
            f"block {b} is in the free queue with ref_cnt {s.k_ref[j]}"
            if queued[j]
            else f"block {b} has ref_cnt 0 but is not in the free queue"
        )
        yield Finding("diag_engine_free_queue_ref_cnt", reason, (), int(b))


def _first_positions(s: State) -> tuple[np.ndarray, np.ndarray]:
    """Each free key once, with its first position (min(position) GROUP BY key)."""
    if s.f_key.size == 0:
        return EMPTY, EMPTY
    order = np.lexsort((s.f_pos, s.f_key))
    keys = s.f_key[order]
    first = np.concatenate([[True], keys[1:] != keys[:-1]])
    return keys[first], s.f_pos[order][first]


def held_free_block(s: State) -> Iterator[Finding]:
    keys, positions = _first_positions(s)
    hi, fi = join(s.h_key, keys)
    for i, f in zip(hi.tolist(), fi.tolist(), strict=True):
        yield s.about_hold(
            "diag_engine_held_free_block",
            i,
            f"holds block {s.h_block[i]}, which is in the free queue at position {positions[f]}",
        )


def duplicate_block(s: State) -> Iterator[Finding]:
    if s.h_key.size == 0:
        return
    code = row_codes([s.h_seq, s.h_group, s.h_key])
    _, first, counts = np.unique(code, return_index=True, return_counts=True)
    for u in np.flatnonzero(counts > 1).tolist():
        i = int(first[u])
        yield s.about_hold(
            "diag_engine_duplicate_block", i, f"lists block {s.h_block[i]} {counts[u]} times"
        )


def free_list_duplicate(s: State) -> Iterator[Finding]:
    if s.f_key.size == 0:
        return
    _, first, counts = np.unique(s.f_key, return_index=True, return_counts=True)
    for u in np.flatnonzero(counts > 1).tolist():
        b = s.f_block[first[u]]
        yield Finding(
            "diag_engine_free_list_duplicate",
            f"block {b} is in the free queue {counts[u]} times",
            (),
            int(b),
        )


def free_count(s: State) -> Iterator[Finding]:
    recorded = s.info.get("free_queue") == "recorded"
    for p in s.pools:
        if p.free_count is None:
            continue
        if recorded:
            counted = int(np.count_nonzero(s.f_pool == p.pool_id))
        elif p.num_blocks is None:
            continue
        else:
            held = np.unique(s.h_block[s.h_pool == p.pool_id]).size
            nulls = int(np.count_nonzero(s.k_null & (s.k_pool == p.pool_id)))
            counted = int(p.num_blocks) - held - nulls
        if counted == p.free_count:
            continue
        said = (
            f"its free queue holds {counted}"
            if recorded
            else f"{counted} of its blocks are held by no request"
        )
        yield Finding(
            "diag_engine_free_count", f"{p.name} counts {p.free_count} free blocks, but {said}"
        )


def disk_block(s: State) -> Iterator[Finding]:
    for p in s.pools:
        if p.tier != "disk":
            continue
        for i in np.flatnonzero(s.h_pool == p.pool_id).tolist():
            yield s.about_hold(
                "diag_engine_disk_block",
                i,
                f"holds block {s.h_block[i]} (block index {s.h_index[i]}) in {p.name}, on "
                "disk: no tier of the spec holds it",
            )


def outside_pool(s: State) -> Iterator[Finding]:
    s_block = div(s.s_slot, s.b)
    nulls = s.k_key[s.k_null]
    used: list[tuple[np.ndarray, np.ndarray, np.ndarray | None, Any, np.ndarray]] = [
        # (pool, block, slot or None, rows -> (request id, seq), the null block)
        (s.h_pool, s.h_block, None, lambda i: s.h_rid[i], np.zeros(s.h_key.size, bool)),
        (s.f_pool, s.f_block, None, lambda i: None, count(nulls, s.f_key) > 0),
        (
            np.zeros(s.s_slot.size, dtype=np.int64),
            s_block,
            s.s_slot,
            s.slot_label,
            np.zeros(s.s_slot.size, bool),
        ),
    ]
    by_id: dict[int, list[Pool]] = {}
    for p in s.pools:
        by_id.setdefault(p.pool_id, []).append(p)
    for pool, block, slot, rid_of, reserved in used:
        if block.size == 0:
            continue
        negative = (block < 0) if slot is None else (block < 0) | (slot < 0)
        negative |= reserved
        pool_ids = [0] if slot is not None else np.unique(pool).tolist()  # slots: pool 0
        for poolid in pool_ids:
            mine = pool == poolid
            targets: list[Pool | None] = list(by_id.get(poolid, [])) or [None]
            for target in targets:
                bad = negative.copy()
                if target is not None and target.num_blocks is not None:
                    bad |= block >= target.num_blocks
                for i in np.flatnonzero(bad & mine).tolist():
                    rid = rid_of(i)
                    what = f"slot {slot[i]}" if slot is not None else f"block {block[i]}"
                    size = (
                        f"{target.num_blocks} blocks"
                        if target is not None and target.num_blocks is not None
                        else "ids >= 0"
                    )
                    where = " (free queue)" if rid is None else f" (request {rid})"
                    said = (
                        f"block {block[i]} is the null block of pool {poolid} (reserved: a "
                        "placeholder)"
                        if reserved[i]
                        else f"{what} is outside pool {poolid} ({size})"
                    )
                    yield Finding(
                        "diag_engine_outside_pool",
                        f"{said}{where}",
                        ids_of(rid),
                        int(block[i]),
                    )


def slot_page_offset(s: State) -> Iterator[Finding]:
    a, b = mod(s.s_slot, s.b), mod(s.s_pos, s.b)
    for i in np.flatnonzero(a != b).tolist():
        seq = int(s.s_seq[i])
        rid = s.label.get(seq)
        yield Finding(
            "diag_engine_slot_page_offset",
            f"token {s.s_pos[i]} of request {s.name(seq, rid)} is in slot {s.s_slot[i]}: "
            f"slot % {s.b} = {a[i]}, pos % {s.b} = {b[i]}",
            ids_of(rid),
        )


def csr_row(s: State) -> Iterator[Finding]:
    if s.c_seq.size == 0:
        return
    first = int(s.c_seq.min())
    back = s.c_end < s.c_begin
    start = (s.c_seq == first) & (s.c_begin != 0)
    last = (s.c_end > s.c_begin) & ((s.c_last < 1) | (s.c_last > s.b))
    for i in np.flatnonzero(back | start | last).tolist():
        seq = int(s.c_seq[i])
        if back[i]:
            reason = (
                f"kv_indptr[{seq + 1}] = {s.c_end[i]} < kv_indptr[{seq}] = {s.c_begin[i]} "
                "(not monotone)"
            )
        elif start[i]:
            reason = f"kv_indptr[0] = {s.c_begin[i]}, not 0"
        else:
            reason = f"kv_last_page_len[{seq}] = {s.c_last[i]} is outside [1, {s.b}]"
        yield Finding("diag_engine_csr_row", reason, ids_of(s.label.get(seq)))


def prefix_hash(s: State) -> Iterator[Finding]:
    if s.q_seq.size == 0:
        return
    hashed = np.flatnonzero(~s.k_null & s.k_has_hash)
    hi, kj = join(s.h_key, s.k_key[hashed])
    if hi.size == 0:
        return
    kj = hashed[kj]
    # (seq, group, index) of those holds against the request hashes, coded as one key
    code = row_codes(
        [
            np.concatenate([s.h_seq[hi], s.q_seq]),
            np.concatenate([s.h_group[hi], s.q_group]),
            np.concatenate([s.h_index[hi], s.q_index]),
        ]
    )
    pair, qi = join(code[: hi.size], code[hi.size :])
    ok = s.q_has_hash[qi]  # a NULL request hash compares with nothing
    pair, qi = pair[ok], qi[ok]
    if pair.size == 0:
        return
    mine, theirs = s.k_hash[kj[pair]], s.q_hash[qi]
    differ = np.flatnonzero(mine != theirs)
    mine_text, theirs_text = mine[differ], theirs[differ]
    for k, p in enumerate(differ.tolist()):
        i = int(hi[pair[p]])
        index = s.h_index[i]
        yield s.about_hold(
            "diag_engine_prefix_hash",
            i,
            f"holds block {s.h_block[i]} at block index {index} with hash "
            f"{mine_text[k][:16]}, but its hash {index} is {theirs_text[k][:16]}",
        )


def _tree(s: State) -> np.ndarray:
    tree: np.ndarray = s.k_has_lock & ~s.k_null
    return tree


def leak(s: State) -> Iterator[Finding]:
    if s.info.get("tree_pages") != "recorded":
        return
    tree_keys = s.k_key[_tree(s)]
    null_keys = s.k_key[s.k_null]
    hold_rows: dict[int, np.ndarray] | None = None
    for p in s.pools:
        if p.num_blocks is None:
            continue
        pages = np.arange(max(0, int(p.num_blocks)), dtype=np.int64)
        keys = s.key(np.full(pages.size, p.pool_id, dtype=np.int64), pages)
        keep = count(null_keys, keys) == 0
        pages, keys = pages[keep], keys[keep]
        free_n = count(s.f_key, keys)
        tree_n = count(tree_keys, keys)
        held = count(s.h_key, keys) > 0
        covered = free_n + tree_n + (held & (tree_n == 0))
        for i in np.flatnonzero(covered != 1).tolist():
            page = int(pages[i])
            ids = ""
            if held[i]:
                hold_rows = hold_rows if hold_rows is not None else rows_of(s.h_key)
                ids = s.hold_ids(hold_rows[int(keys[i])])
            if covered[i] == 0:
                reason = (
                    f"page {page} is neither free, in the radix tree, nor held by a request "
                    "(leaked)"
                )
            else:
                by = f", held by {ids}" if held[i] else ""
                reason = (
                    f"page {page} is counted {covered[i]} times: free {free_n[i]}, in the "
                    f"radix tree {tree_n[i]}{by}"
                )
            yield Finding("diag_engine_leak", reason, split_ids(ids), page)


def tree_page_free(s: State) -> Iterator[Finding]:
    keys, positions = _first_positions(s)
    tree = np.flatnonzero(_tree(s))
    ti, fi = join(s.k_key[tree], keys)
    for t, f in zip(ti.tolist(), fi.tolist(), strict=True):
        j = int(tree[t])
        yield Finding(
            "diag_engine_tree_page_free",
            f"page {s.k_block[j]} is in the radix tree (lock_ref {s.k_lock[j]}) and in the "
            f"free list at position {positions[f]}",
            (),
            int(s.k_block[j]),
        )


def lock_ref(s: State) -> Iterator[Finding]:
    tree = np.flatnonzero(_tree(s))
    if tree.size == 0 or s.h_key.size == 0:
        return
    # count(DISTINCT seq_id) of the holds of each key
    code = row_codes([s.h_key, s.h_seq])
    _, first = np.unique(code, return_index=True)
    running = count(s.h_key[first], s.k_key[tree])
    bad = np.flatnonzero((running > 0) & (s.k_lock[tree] < running))
    if bad.size == 0:
        return
    rows = rows_of(s.h_key)
    for t in bad.tolist():
        j = int(tree[t])
        ids = s.hold_ids(rows[int(s.k_key[j])])
        yield Finding(
            "diag_engine_lock_ref",
            f"page {s.k_block[j]} is in a radix-tree node with lock_ref {s.k_lock[j]} but "
            f"{running[t]} running request(s) hold it: {ids}",
            split_ids(ids),
            int(s.k_block[j]),
        )


def unresolved_token(s: State) -> Iterator[Finding]:
    kinds = np.array([k in TOKEN_KINDS for k in s.g_kind], dtype=bool)
    if not kinds.any() or s.r_seq.size == 0:
        return
    # every (request row, group row) pair, as the views' CROSS JOIN
    r, g = (a.reshape(-1) for a in np.meshgrid(np.arange(s.r_seq.size), np.flatnonzero(kinds)))
    n, b = s.r_tokens[r], s.g_size[g]
    start, known = kept_start(
        [s.g_kind[j] for j in g.tolist()], s.g_window[g], s.g_has_window[g], n
    )
    keep = known & (start < n)
    r, g, n, b, start = r[keep], g[keep], n[keep], b[keep], start[keep]
    lo, hi = div(start, b), div(n + b - 1, b)
    width = np.maximum(hi - lo, 0)
    pair = np.repeat(np.arange(r.size), width)
    index = lo[pair] + np.arange(pair.size) - np.repeat(np.cumsum(width) - width, width)
    seq, group = s.r_seq[r][pair], s.g_id[g][pair]
    code = row_codes(
        [
            np.concatenate([seq, s.h_seq, s.e_seq]),
            np.concatenate([group, s.h_group, s.e_group]),
            np.concatenate([index, s.h_index, s.e_index]),
        ]
    )
    held = count(code[seq.size : seq.size + s.h_seq.size], code[: seq.size]) > 0
    lists = row_codes([np.concatenate([seq, s.e_seq]), np.concatenate([group, s.e_group])])
    for p in np.flatnonzero(~held).tolist():
        k = int(pair[p])
        i, bs, first = int(index[p]), int(b[k]), int(start[k])
        rid = s.r_rid[int(r[k])]
        mine = lists[seq.size :] == lists[p]
        length = int(s.e_index[mine].max()) + 1 if mine.any() else 0
        j = int(g[k])
        name = s.g_kind[j]
        window = f" {s.g_window[j]}" if s.g_has_window[j] and name != FULL_ATTENTION else ""
        where = "a placeholder" if i < length else f"past the end of its {length}-entry list"
        who = s.name(int(seq[p]), rid)
        yield Finding(
            "diag_engine_unresolved_token",
            f"request {who} holds no block at entry {i} of KV-cache group {group[p]} "
            f"({name}{window}, block size {bs}): {where}, though the group keeps tokens "
            f"{max(i * bs, first)}..{min((i + 1) * bs, int(n[k])) - 1} of its {n[k]} "
            "computed tokens there",
            ids_of(rid),
        )


CHECKS: tuple[Check, ...] = (
    refcount_mismatch,
    free_queue_ref_cnt,
    held_free_block,
    duplicate_block,
    free_list_duplicate,
    free_count,
    disk_block,
    outside_pool,
    slot_page_offset,
    csr_row,
    prefix_hash,
    leak,
    tree_page_free,
    lock_ref,
    unresolved_token,
)
