"""The engine invariants in memory: every ``diag_engine_*`` view of sql/engines.sql computed
with numpy over an engine's state, no database (issue 27, docs/engines.md).

The SQL views stay the reference and the report's source; this module gives the same
findings (check name, reason text, request ids, block id) in well under a millisecond for a
pool of a thousand blocks, so that a fuzzer can check every state of an engine and an
engine's own tests can ``assert_consistent`` after every step. A differential test on
random states (tests/engines/test_fastcheck.py) keeps the two equal.

Semantics follow SQL where it matters: integer ``//`` and ``%`` truncate toward zero (as
DuckDB's do), a join on duplicated keys gives one finding a pair, a missing value (NULL) is
never equal to anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .snapshot import Snapshot
from .tables import EngineState, Pool

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Finding:
    """One finding of an engine invariant: ``check`` is the view's name, ``reason`` its
    text, ``request_ids`` the requests it names (sorted), ``block_id`` the block or page."""

    check: str
    reason: str
    request_ids: tuple[str, ...] = ()
    block_id: int | None = None
    severity: str = "warning"

    def __str__(self) -> str:
        return f"{self.check}: {self.reason}"

    def sort_key(self) -> tuple[str, str, tuple[str, ...], int, int]:
        none = self.block_id is None
        return (self.check, self.reason, self.request_ids, int(none), self.block_id or 0)


def check_snapshot(snapshot: Snapshot) -> list[Finding]:
    """Every engine invariant on one snapshot, in memory. The snapshot is first mapped by
    its engine's ``to_state``, as ``load_engine`` does: a snapshot the import refuses
    raises the same ``InputError``. ``[]`` when the state is consistent."""
    from . import engine

    return check_state(engine(snapshot.engine).to_state(snapshot))


def check_state(state: EngineState) -> list[Finding]:
    """Every engine invariant on an ``EngineState``, sorted by check, reason, ids."""
    s = _State(state)
    found = [f for check in CHECKS for f in check(s)]
    found.sort(key=Finding.sort_key)
    return found


def assert_captured(what: str, capture: Callable[[], Snapshot]) -> None:
    """Capture a live engine state and check it: an ``AssertionError`` naming every finding
    (check, reason, request ids, block id), or the capture's refusal (the state cannot be
    mapped: an ``InputError``, its ``__cause__``). The body of each engine module's
    ``assert_consistent``."""
    from ..errors import InputError

    try:
        found = check_snapshot(capture())
    except InputError as e:
        details = "".join(f"\n  {d}" for d in e.details)
        raise AssertionError(f"{what} state cannot be mapped: {e.message}{details}") from e
    if found:
        raise AssertionError(describe(what, found))


def describe(what: str, found: list[Finding]) -> str:
    """Findings as an assertion message: a count, then one line each."""
    lines = [f"{what} is inconsistent: {len(found)} finding(s)"]
    for f in found:
        ids = []
        if f.request_ids:
            ids.append("request " + ", ".join(f.request_ids))
        if f.block_id is not None:
            ids.append(f"block {f.block_id}")
        lines.append(f"  {f}" + (f" [{'; '.join(ids)}]" if ids else ""))
    return "\n".join(lines)


def check_sql(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """The same findings from the stored engine tables through the SQL views, in one
    query (view ``engine_findings``): the reference the fast check is tested against."""
    rows = con.execute(
        "SELECT check_name, reason, request_ids, block_id FROM engine_findings"
    ).fetchall()
    found = [
        Finding(check, reason, tuple(sorted(ids)), None if block is None else int(block))
        for check, reason, ids, block in rows
    ]
    found.sort(key=Finding.sort_key)
    return found


def digest(snapshot: Snapshot) -> str:
    """A digest of everything a check reads (engine, arrays' dtypes, shapes and bytes, the
    metadata): equal digests, equal findings. For memoizing the checks of states that
    repeat (a fuzzer revisits most of its states)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(snapshot.engine.encode())
    for name in sorted(snapshot.arrays):
        a = np.ascontiguousarray(snapshot.arrays[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    h.update(json.dumps(snapshot.meta, sort_keys=True, default=str).encode())
    h.update(json.dumps([t.to_dict() for t in snapshot.cache_tensors], default=str).encode())
    return h.hexdigest()


# -- the state as numpy columns -------------------------------------------------------------
def _ints(t: pa.Table | None, name: str) -> np.ndarray:
    if t is None or t.num_rows == 0:
        return _EMPTY
    col = t.column(name)
    if col.null_count:
        col = pc.fill_null(col, 0)
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _valid(t: pa.Table | None, name: str) -> np.ndarray:
    if t is None or t.num_rows == 0:
        return np.empty(0, dtype=bool)
    col = t.column(name)
    if col.null_count == 0:
        return np.ones(t.num_rows, dtype=bool)
    return np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _strings(t: pa.Table | None, name: str) -> list[str | None]:
    if t is None or t.num_rows == 0:
        return []
    return t.column(name).to_pylist()  # type: ignore[no-any-return]


class _State:
    """The engine tables of one state as numpy columns, and the keys the views join on."""

    def __init__(self, state: EngineState) -> None:
        self.b = int(state.block_size)
        self.pools: list[Pool] = list(state.pools)
        info = dict(state.info)
        if state.free_blocks is not None:
            info["free_queue"] = "recorded"
        self.info = info
        req = state.requests
        label: dict[int, str] = {}
        for seq, rid in zip(
            _ints(req, "seq_id").tolist(), _strings(req, "request_id"), strict=True
        ):
            if rid is not None and (seq not in label or rid < label[seq]):
                label[seq] = rid
        self.label = label
        self._label_seq = np.array(sorted(label), dtype=np.int64)
        self._label_rid = np.array([label[q] for q in self._label_seq.tolist()] + [None], object)
        bt = state.block_table
        held = _valid(bt, "block_id")
        self.h_seq = _ints(bt, "seq_id")[held]
        self.h_group = _ints(bt, "group_id")[held]
        self.h_index = _ints(bt, "block_index")[held]
        self.h_pool = _ints(bt, "pool_id")[held]
        self.h_block = _ints(bt, "block_id")[held]
        self.h_rid = self.labels(self.h_seq)
        blocks = state.blocks
        self.k_pool = _ints(blocks, "pool_id")
        self.k_block = _ints(blocks, "block_id")
        self.k_ref = _ints(blocks, "ref_cnt")
        self.k_has_ref = _valid(blocks, "ref_cnt")
        self.k_lock = _ints(blocks, "lock_ref")
        self.k_has_lock = _valid(blocks, "lock_ref")
        null = _valid(blocks, "is_null") & (_ints(blocks, "is_null") != 0)
        self.k_null = null
        self.k_hash = np.array(_strings(blocks, "block_hash"), dtype=object)
        self.k_has_hash = _valid(blocks, "block_hash")
        free = state.free_blocks
        self.f_pool = _ints(free, "pool_id")
        self.f_pos = _ints(free, "position")
        self.f_block = _ints(free, "block_id")
        slots = state.token_slots
        self.s_seq = _ints(slots, "seq_id")
        self.s_pos = _ints(slots, "token_pos")
        self.s_slot = _ints(slots, "slot")
        csr = state.csr_rows
        self.c_seq = _ints(csr, "seq_id")
        self.c_begin = _ints(csr, "indptr_begin")
        self.c_end = _ints(csr, "indptr_end")
        self.c_last = _ints(csr, "last_page_len")
        hashes = state.request_hashes
        self.q_seq = _ints(hashes, "seq_id")
        self.q_group = _ints(hashes, "group_id")
        self.q_index = _ints(hashes, "block_index")
        self.q_hash = np.array(_strings(hashes, "block_hash"), dtype=object)
        self.q_has_hash = _valid(hashes, "block_hash")
        # one int64 key per (pool_id, block_id), the same coding in every table
        pool_ids = np.unique(
            np.concatenate(
                [self.h_pool, self.k_pool, self.f_pool, np.array([p.pool_id for p in self.pools])]
            ).astype(np.int64)
        )
        self._pool_ids = pool_ids
        self.h_key = self.key(self.h_pool, self.h_block)
        self.k_key = self.key(self.k_pool, self.k_block)
        self.f_key = self.key(self.f_pool, self.f_block)

    def labels(self, seq: np.ndarray) -> np.ndarray:
        """The request id of each seq_id (None where no request has it), as an object
        array: pagedkv_request_label's min(request_id) GROUP BY seq_id."""
        at = np.searchsorted(self._label_seq, seq)
        found = at < self._label_seq.size
        found[found] = self._label_seq[at[found]] == seq[found]
        return self._label_rid[np.where(found, at, self._label_seq.size)]

    def about_hold(self, check: str, i: int, what: str) -> Finding:
        """A finding about hold ``i``: "request R " + ``what``, naming R and the block."""
        rid = self.h_rid[i]
        return Finding(
            check,
            f"request {self.name(int(self.h_seq[i]), rid)} {what}",
            _ids(rid),
            int(self.h_block[i]),
        )

    def slot_label(self, i: int) -> str | None:
        return self.label.get(int(self.s_seq[i]))

    def key(self, pool: np.ndarray, block: np.ndarray) -> np.ndarray:
        n = max(1, self._pool_ids.size)
        return block * n + np.searchsorted(self._pool_ids, pool)

    def name(self, seq: int, rid: str | None) -> str:
        return str(seq) if rid is None else rid

    def hold_ids(self, rows: np.ndarray) -> str:
        """string_agg(DISTINCT request_id, ' ' ORDER BY request_id) of some holds."""
        return " ".join(sorted({r for i in rows.tolist() if (r := self.h_rid[i]) is not None}))


def _count(keys: np.ndarray, of: np.ndarray) -> np.ndarray:
    """How many times each of ``of`` occurs in ``keys``."""
    if keys.size == 0:
        return np.zeros(of.size, dtype=np.int64)
    s = np.sort(keys)
    return np.searchsorted(s, of, side="right") - np.searchsorted(s, of, side="left")


def _join(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with left[i] == right[j]: an inner join's row pairs."""
    if left.size == 0 or right.size == 0:
        return _EMPTY, _EMPTY
    order = np.argsort(right, kind="stable")
    s = right[order]
    lo = np.searchsorted(s, left, side="left")
    hi = np.searchsorted(s, left, side="right")
    n = hi - lo
    li = np.repeat(np.arange(left.size), n)
    starts = np.repeat(lo - np.cumsum(n) + n, n)
    ri = order[starts + np.arange(li.size)]
    return li, ri


def row_codes(cols: list[np.ndarray]) -> np.ndarray:
    """One int64 per row of the columns, equal exactly where all columns are and ordered
    as the rows are lexicographically: the columns' values mixed radix-wise (each offset by
    its minimum), or ranked when their ranges are too wide for 62 bits."""
    code = np.zeros(cols[0].size, dtype=np.int64)
    if code.size == 0:
        return code
    spans = [int(c.max()) - int(c.min()) + 1 for c in cols]
    if np.prod([float(x) for x in spans]) < 2.0**62:
        for c, span in zip(cols, spans, strict=True):
            code = code * span + (c - c.min())
        return code
    for c in cols:
        values, inverse = np.unique(c, return_inverse=True)
        code = code * values.size + inverse.reshape(-1)
    return code


def _rows_of(keys: np.ndarray) -> dict[int, np.ndarray]:
    """The rows of each key (for the few offending keys a reason lists)."""
    out: dict[int, list[int]] = {}
    for i, k in enumerate(keys.tolist()):
        out.setdefault(k, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def _div(a: np.ndarray, b: int) -> np.ndarray:
    """DuckDB's BIGINT ``a // b``: truncated toward zero."""
    out: np.ndarray = np.sign(a) * (np.abs(a) // b)
    return out


def _mod(a: np.ndarray, b: int) -> np.ndarray:
    """DuckDB's BIGINT ``a % b``: the sign of ``a``."""
    out: np.ndarray = np.fmod(a, b)
    return out


def _ids(rid: str | None) -> tuple[str, ...]:
    return () if rid is None else (rid,)


def _split(text: str) -> tuple[str, ...]:
    return tuple(sorted(x for x in text.split(" ") if x))


# -- the checks, one function a view, in the views' order -----------------------------------
Check = Callable[[_State], Iterator[Finding]]


def ref_cnt_mismatch(s: _State) -> Iterator[Finding]:
    held = _count(s.h_key, s.k_key)
    bad = np.flatnonzero(s.k_has_ref & ~s.k_null & (s.k_ref != held))
    if bad.size == 0:
        return
    rows = _rows_of(s.h_key)
    for j in bad.tolist():
        n = int(held[j])
        ids = s.hold_ids(rows.get(int(s.k_key[j]), _EMPTY))
        entries = "entry" if n == 1 else "entries"
        yield Finding(
            "diag_engine_ref_cnt_mismatch",
            f"ref_cnt {s.k_ref[j]} but {n} block-list {entries} hold block {s.k_block[j]}",
            _split(ids),
            int(s.k_block[j]),
        )


def free_queue_ref_cnt(s: _State) -> Iterator[Finding]:
    if s.info.get("free_queue") != "recorded":
        return
    queued = _count(s.f_key, s.k_key) > 0
    bad = np.flatnonzero(s.k_has_ref & ~s.k_null & ((s.k_ref == 0) != queued))
    for j in bad.tolist():
        b = s.k_block[j]
        reason = (
            f"block {b} is in the free queue with ref_cnt {s.k_ref[j]}"
            if queued[j]
            else f"block {b} has ref_cnt 0 but is not in the free queue"
        )
        yield Finding("diag_engine_free_queue_ref_cnt", reason, (), int(b))


def _first_positions(s: _State) -> tuple[np.ndarray, np.ndarray]:
    """Each free key once, with its first position (min(position) GROUP BY key)."""
    if s.f_key.size == 0:
        return _EMPTY, _EMPTY
    order = np.lexsort((s.f_pos, s.f_key))
    keys = s.f_key[order]
    first = np.concatenate([[True], keys[1:] != keys[:-1]])
    return keys[first], s.f_pos[order][first]


def held_free_block(s: _State) -> Iterator[Finding]:
    keys, positions = _first_positions(s)
    hi, fi = _join(s.h_key, keys)
    for i, f in zip(hi.tolist(), fi.tolist(), strict=True):
        yield s.about_hold(
            "diag_engine_held_free_block",
            i,
            f"holds block {s.h_block[i]}, which is in the free queue at position {positions[f]}",
        )


def duplicate_block(s: _State) -> Iterator[Finding]:
    if s.h_key.size == 0:
        return
    code = row_codes([s.h_seq, s.h_group, s.h_key])
    _, first, counts = np.unique(code, return_index=True, return_counts=True)
    for u in np.flatnonzero(counts > 1).tolist():
        i = int(first[u])
        yield s.about_hold(
            "diag_engine_duplicate_block", i, f"lists block {s.h_block[i]} {counts[u]} times"
        )


def free_queue_duplicate(s: _State) -> Iterator[Finding]:
    if s.f_key.size == 0:
        return
    _, first, counts = np.unique(s.f_key, return_index=True, return_counts=True)
    for u in np.flatnonzero(counts > 1).tolist():
        b = s.f_block[first[u]]
        yield Finding(
            "diag_engine_free_queue_duplicate",
            f"block {b} is in the free queue {counts[u]} times",
            (),
            int(b),
        )


def free_count(s: _State) -> Iterator[Finding]:
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


def disk_block(s: _State) -> Iterator[Finding]:
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


def slot_outside_pool(s: _State) -> Iterator[Finding]:
    s_block = _div(s.s_slot, s.b)
    used: list[tuple[np.ndarray, np.ndarray, np.ndarray | None, Any]] = [
        # (pool, block, slot or None, rows -> (request id, seq))
        (s.h_pool, s.h_block, None, lambda i: s.h_rid[i]),
        (s.f_pool, s.f_block, None, lambda i: None),
        (np.zeros(s.s_slot.size, dtype=np.int64), s_block, s.s_slot, s.slot_label),
    ]
    by_id: dict[int, list[Pool]] = {}
    for p in s.pools:
        by_id.setdefault(p.pool_id, []).append(p)
    for pool, block, slot, rid_of in used:
        if block.size == 0:
            continue
        negative = (block < 0) if slot is None else (block < 0) | (slot < 0)
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
                    yield Finding(
                        "diag_engine_slot_outside_pool",
                        f"{what} is outside pool {poolid} ({size}){where}",
                        _ids(rid),
                        int(block[i]),
                    )


def slot_page_offset(s: _State) -> Iterator[Finding]:
    a, b = _mod(s.s_slot, s.b), _mod(s.s_pos, s.b)
    for i in np.flatnonzero(a != b).tolist():
        seq = int(s.s_seq[i])
        rid = s.label.get(seq)
        yield Finding(
            "diag_engine_slot_page_offset",
            f"token {s.s_pos[i]} of request {s.name(seq, rid)} is in slot {s.s_slot[i]}: "
            f"slot % {s.b} = {a[i]}, pos % {s.b} = {b[i]}",
            _ids(rid),
        )


def csr_row(s: _State) -> Iterator[Finding]:
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
        yield Finding("diag_engine_csr_row", reason, _ids(s.label.get(seq)))


def block_hash_mismatch(s: _State) -> Iterator[Finding]:
    if s.q_seq.size == 0:
        return
    hashed = np.flatnonzero(~s.k_null & s.k_has_hash)
    hi, kj = _join(s.h_key, s.k_key[hashed])
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
    pair, qi = _join(code[: hi.size], code[hi.size :])
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
            "diag_engine_block_hash_mismatch",
            i,
            f"holds block {s.h_block[i]} at block index {index} with hash "
            f"{mine_text[k][:16]}, but its hash {index} is {theirs_text[k][:16]}",
        )


def _tree(s: _State) -> np.ndarray:
    tree: np.ndarray = s.k_has_lock & ~s.k_null
    return tree


def page_conservation(s: _State) -> Iterator[Finding]:
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
        keep = _count(null_keys, keys) == 0
        pages, keys = pages[keep], keys[keep]
        free_n = _count(s.f_key, keys)
        tree_n = _count(tree_keys, keys)
        held = _count(s.h_key, keys) > 0
        covered = free_n + tree_n + (held & (tree_n == 0))
        for i in np.flatnonzero(covered != 1).tolist():
            page = int(pages[i])
            ids = ""
            if held[i]:
                hold_rows = hold_rows if hold_rows is not None else _rows_of(s.h_key)
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
            yield Finding("diag_engine_page_conservation", reason, _split(ids), page)


def tree_page_free(s: _State) -> Iterator[Finding]:
    keys, positions = _first_positions(s)
    tree = np.flatnonzero(_tree(s))
    ti, fi = _join(s.k_key[tree], keys)
    for t, f in zip(ti.tolist(), fi.tolist(), strict=True):
        j = int(tree[t])
        yield Finding(
            "diag_engine_tree_page_free",
            f"page {s.k_block[j]} is in the radix tree (lock_ref {s.k_lock[j]}) and in the "
            f"free list at position {positions[f]}",
            (),
            int(s.k_block[j]),
        )


def lock_ref(s: _State) -> Iterator[Finding]:
    tree = np.flatnonzero(_tree(s))
    if tree.size == 0 or s.h_key.size == 0:
        return
    # count(DISTINCT seq_id) of the holds of each key
    code = row_codes([s.h_key, s.h_seq])
    _, first = np.unique(code, return_index=True)
    running = _count(s.h_key[first], s.k_key[tree])
    bad = np.flatnonzero((running > 0) & (s.k_lock[tree] < running))
    if bad.size == 0:
        return
    rows = _rows_of(s.h_key)
    for t in bad.tolist():
        j = int(tree[t])
        ids = s.hold_ids(rows[int(s.k_key[j])])
        yield Finding(
            "diag_engine_lock_ref",
            f"page {s.k_block[j]} is in a radix-tree node with lock_ref {s.k_lock[j]} but "
            f"{running[t]} running request(s) hold it: {ids}",
            _split(ids),
            int(s.k_block[j]),
        )


CHECKS: tuple[Check, ...] = (
    ref_cnt_mismatch,
    free_queue_ref_cnt,
    held_free_block,
    duplicate_block,
    free_queue_duplicate,
    free_count,
    disk_block,
    slot_outside_pool,
    slot_page_offset,
    csr_row,
    block_hash_mismatch,
    page_conservation,
    tree_page_free,
    lock_ref,
)
