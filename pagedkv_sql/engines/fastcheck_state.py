"""The fast check's floor: an engine state as numpy columns (``State``), the SQL-like
joins, counts and integer arithmetic the invariants share, and the ``Finding`` they give
(engines/fastcheck.py runs them; engines/fastcheck_rules.py holds one function a view)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import findings
from ..invariants import ENGINE
from .tables import EngineState, Pool

EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Finding:
    """One finding of an engine invariant (``findings.Finding``): ``check`` is the view's
    name, ``reason`` its text, ``request_ids`` the requests it names (sorted), ``block_id``
    the block or page."""

    check: str
    reason: str
    request_ids: tuple[str, ...] = ()
    block_id: int | None = None
    severity: str = "warning"

    model = ENGINE  # the engine views' invariants, computed in memory
    where = ""  # a snapshot: no step
    cause = None

    @property
    def message(self) -> str:
        return self.reason

    @property
    def block_ids(self) -> tuple[int, ...]:
        return () if self.block_id is None else (self.block_id,)

    def extra(self) -> dict[str, object]:
        return {}

    def __str__(self) -> str:
        return findings.line(self)

    def sort_key(self) -> tuple[int, str, str, tuple[str, ...], int, int]:
        """Cause before consequence (the catalogue's rank), then a stable order."""
        none = self.block_id is None
        return (
            findings.rank(self),
            self.check,
            self.reason,
            self.request_ids,
            int(none),
            self.block_id or 0,
        )


# -- the state as numpy columns -------------------------------------------------------------
def _ints(t: pa.Table | None, name: str) -> np.ndarray:
    if t is None or t.num_rows == 0:
        return EMPTY
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


class State:
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
        self.r_seq = _ints(req, "seq_id")
        self.r_rid = _strings(req, "request_id")
        computed = _valid(req, "num_computed_tokens")
        self.r_tokens = np.where(
            computed, _ints(req, "num_computed_tokens"), _ints(req, "num_tokens")
        )
        bt = state.block_table
        self.e_seq = _ints(bt, "seq_id")  # every entry, holes and placeholders too
        self.e_group = _ints(bt, "group_id")
        self.e_index = _ints(bt, "block_index")
        held = _valid(bt, "block_id")
        self.h_seq = self.e_seq[held]
        self.h_group = self.e_group[held]
        self.h_index = self.e_index[held]
        self.h_pool = _ints(bt, "pool_id")[held]
        self.h_block = _ints(bt, "block_id")[held]
        groups = state.kv_groups
        self.g_id = _ints(groups, "group_id")
        self.g_kind = _strings(groups, "kind")
        self.g_size = _ints(groups, "block_size")
        self.g_window = _ints(groups, "window_tokens")
        self.g_has_window = _valid(groups, "window_tokens")
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
        # the null block is a placeholder: an entry naming it holds nothing (engine_holds)
        real = count(self.k_key[self.k_null], self.h_key) == 0
        for name in ("h_seq", "h_group", "h_index", "h_pool", "h_block", "h_key"):
            setattr(self, name, getattr(self, name)[real])
        self.h_rid = self.labels(self.h_seq)

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
            ids_of(rid),
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


def count(keys: np.ndarray, of: np.ndarray) -> np.ndarray:
    """How many times each of ``of`` occurs in ``keys``."""
    if keys.size == 0:
        return np.zeros(of.size, dtype=np.int64)
    s = np.sort(keys)
    return np.searchsorted(s, of, side="right") - np.searchsorted(s, of, side="left")


def join(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with left[i] == right[j]: an inner join's row pairs."""
    if left.size == 0 or right.size == 0:
        return EMPTY, EMPTY
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


def rows_of(keys: np.ndarray) -> dict[int, np.ndarray]:
    """The rows of each key (for the few offending keys a reason lists)."""
    out: dict[int, list[int]] = {}
    for i, k in enumerate(keys.tolist()):
        out.setdefault(k, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def div(a: np.ndarray, b: int | np.ndarray) -> np.ndarray:
    """DuckDB's BIGINT ``a // b``: truncated toward zero."""
    out: np.ndarray = np.sign(a) * (np.abs(a) // b)
    return out


def mod(a: np.ndarray, b: int) -> np.ndarray:
    """DuckDB's BIGINT ``a % b``: the sign of ``a``."""
    out: np.ndarray = np.fmod(a, b)
    return out


def ids_of(rid: str | None) -> tuple[str, ...]:
    return () if rid is None else (rid,)


def split_ids(text: str) -> tuple[str, ...]:
    return tuple(sorted(x for x in text.split(" ") if x))
