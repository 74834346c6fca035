"""What the pictures show, read from the database with the named queries of sql/report.sql
into numpy arrays: the blocks of each tier, and each sequence's logical blocks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import duckdb
import numpy as np

from ..sqlfiles import parse, sql_dir

SQL_FILE = "report.sql"
# The longest block table drawn as a strip, in blocks (1M tokens at 16 tokens a block).
MAX_STRIP_BLOCKS = 65536

# Logical block states of a sequence's strip (report_logical_blocks), as one character each.
STRIP_CODES = {0: ".", 1: "r", 2: "s", 3: "c", 4: "x", 5: "m"}
STRIP_NAMES = {
    ".": "no block",
    "r": "resident",
    "s": "resident, shared",
    "c": "swapped to CPU",
    "x": "resident, refcount mismatch",
    "m": "missing",
}


@cache
def _statements() -> dict[str, str]:
    path = sql_dir() / SQL_FILE
    return {s.name: s.sql for s in parse(path.read_text(encoding="utf-8"), SQL_FILE)}


def query(name: str) -> str:
    return _statements()[name]


def _arrays(
    con: duckdb.DuckDBPyConnection, name: str, params: list[object] | None = None
) -> dict[str, np.ndarray]:
    table = con.sql(query(name), params=params).to_arrow_table()
    return {c: table.column(c).to_numpy() for c in table.column_names}


@dataclass(frozen=True)
class TierBlocks:
    """The distinct block addresses of one tier, sorted, with what holds each."""

    tier: str  # "gpu" | "cpu"
    address: np.ndarray  # int64, sorted, distinct
    holders: np.ndarray  # block-table slots holding the block
    refcount: np.ndarray  # the largest refcount (gpu), or 0 (cpu)
    seq_id: np.ndarray  # the owning sequence, -1 when no sequence owns it
    orphan: np.ndarray  # bool: held only by block tables no sequence points to
    mismatch: np.ndarray  # bool: diag_refcount_mismatch names it
    group: np.ndarray | None = None  # the KV-cache group (an engine import of several)

    def __len__(self) -> int:
        return int(self.address.size)


def tier_blocks(con: duckdb.DuckDBPyConnection) -> tuple[TierBlocks, TierBlocks]:
    """The GPU and CPU tiers' blocks."""
    gpu, cpu, _ = tiers_and_slots(con)
    return gpu, cpu


@dataclass(frozen=True)
class Slots:
    """Block-table slots with a strip state each (STRIP_CODES), one a row of the relation."""

    table: np.ndarray
    index: np.ndarray
    state: np.ndarray


def tiers_and_slots(con: duckdb.DuckDBPyConnection) -> tuple[TierBlocks, TierBlocks, Slots]:
    """The GPU and CPU tiers' blocks, and the GPU slots with their bases' states (what the
    strips draw), from one read of block_table_entry."""
    gpu, slots = _gpu_blocks(_arrays(con, "report_gpu_rows"), _arrays(con, "report_owners"))
    gpu = _with_groups(con, gpu)
    c = _arrays(con, "report_cpu_blocks")
    n = c["address"].size
    cpu = TierBlocks(
        "cpu",
        c["address"].astype(np.int64, copy=False),
        c["holders"].astype(np.int64, copy=False),
        np.zeros(n, np.int64),
        c["seq_id"].astype(np.int64, copy=False),
        c["orphan"].astype(bool),
        np.zeros(n, bool),
    )
    return gpu, cpu, slots


def _gpu_blocks(
    rows: dict[str, np.ndarray], owners: dict[str, np.ndarray]
) -> tuple[TierBlocks, Slots]:
    """Each distinct base of block_table_entry's rows, in address order: the block-table
    slots holding it (exact duplicate rows are one slot), its largest refcount, its owner
    (the smallest seq_id whose root points to a holder, -1 if none), whether every holder
    is an orphan, and whether check calls it a mismatch: diag_refcount_mismatch's condition
    (the holders disagree on the refcount, or it is not the number of holders).
    Plan: one sort of the rows by base and reductions over its runs; only the rows of
    bases with more than one row are sorted again to count distinct slots. The slots get
    their base's strip state: 4 mismatch, else 2 shared, else 1 resident."""
    table = rows["block_table_id"].astype(np.int64, copy=False)
    index = rows["block_index"].astype(np.int64, copy=False)
    base = rows["physical_block_base"].astype(np.int64, copy=False)
    refcount = rows["refcount"].astype(np.int64, copy=False)
    order = np.argsort(base, kind="stable")
    table, index, base, refcount = table[order], index[order], base[order], refcount[order]
    starts = np.flatnonzero(np.concatenate([[True], base[1:] != base[:-1]])) if base.size else base
    n = np.diff(np.append(starts, base.size))
    low = np.minimum.reduceat(refcount, starts) if base.size else refcount
    high = np.maximum.reduceat(refcount, starts) if base.size else refcount
    ptr = owners["block_table_ptr"].astype(np.int64, copy=False)  # sorted, distinct
    found = np.minimum(np.searchsorted(ptr, table), max(ptr.size - 1, 0))
    owned = ptr[found] == table if ptr.size else np.zeros(table.size, bool)
    none = np.iinfo(np.int64).max
    owner = np.where(
        owned, owners["seq_id"].astype(np.int64, copy=False)[found] if ptr.size else 0, none
    )
    seq_id = np.minimum.reduceat(owner, starts) if base.size else owner
    orphan = ~np.logical_or.reduceat(owned, starts) if base.size else owned
    holders = n.copy()
    shared = np.repeat(n > 1, n)
    if shared.any():
        b, t, i = base[shared], table[shared], index[shared]
        again = np.lexsort((i, t, b))
        b, t, i = b[again], t[again], i[again]
        slot = np.concatenate([[True], (b[1:] != b[:-1]) | (t[1:] != t[:-1]) | (i[1:] != i[:-1])])
        runs = np.flatnonzero(np.concatenate([[True], b[1:] != b[:-1]]))
        holders[n > 1] = np.add.reduceat(slot.astype(np.int64, copy=False), runs)
    mismatch = (low != high) | (low != holders)
    blocks = TierBlocks(
        "gpu",
        base[starts],
        holders,
        high,
        np.where(seq_id == none, -1, seq_id),
        orphan.astype(bool),
        mismatch,
    )
    state = np.where(mismatch, 4, np.where(holders > 1, 2, 1))
    return blocks, Slots(table, index, np.repeat(state, n))


def _with_groups(con: duckdb.DuckDBPyConnection, gpu: TierBlocks) -> TierBlocks:
    """After an engine import of several KV-cache groups (one shared pool): the spec's
    blocks (the primary group's) with the other groups' blocks, each with its group;
    ``gpu`` as it is otherwise. A block of another group is a mismatch where the engine's
    ref_cnt is not its holders."""
    if not capabilities(con)["kv_groups"]:
        return gpu
    primary, groups = con.execute(query("report_kv_groups")).fetchall()[0]
    if groups < 2:
        return gpu
    o = _arrays(con, "report_group_blocks", [primary])
    holders = o["holders"].astype(np.int64, copy=False)
    refcount = o["refcount"].astype(np.int64, copy=False)
    parts = [
        (gpu.address, np.full(len(gpu), primary, np.int64), gpu.holders, gpu.refcount),
        (o["address"], o["group_id"], holders, refcount),
    ]
    address, group, held, counted = (np.concatenate([p[k] for p in parts]) for k in range(4))
    seq = np.concatenate([gpu.seq_id, o["seq_id"].astype(np.int64, copy=False)])
    orphan = np.concatenate([gpu.orphan, np.zeros(holders.size, bool)])
    mismatch = np.concatenate([gpu.mismatch, refcount != holders])
    order = np.argsort(address.astype(np.int64, copy=False), kind="stable")
    address, group, held, counted = address[order], group[order], held[order], counted[order]
    seq, orphan, mismatch = seq[order], orphan[order], mismatch[order]
    # an address in two groups (a fault the engine checks name) is one block of the map
    starts = np.flatnonzero(np.concatenate([[True], address[1:] != address[:-1]]))
    if starts.size == address.size:
        return TierBlocks("gpu", address, held, counted, seq, orphan, mismatch, group)
    owned = np.where(seq < 0, np.iinfo(np.int64).max, seq)
    first = np.minimum.reduceat(owned, starts)
    return TierBlocks(
        "gpu",
        address[starts],
        np.add.reduceat(held, starts),
        np.maximum.reduceat(counted, starts),
        np.where(first == np.iinfo(np.int64).max, -1, first),
        np.logical_and.reduceat(orphan, starts),
        np.logical_or.reduceat(mismatch, starts) | (np.diff(np.append(starts, address.size)) > 1),
        np.minimum.reduceat(group, starts),
    )


@dataclass(frozen=True)
class Sequence:
    seq_id: int
    block_tables: str
    tokens: int
    strip: str  # one character a logical block, STRIP_CODES


def sequences(con: duckdb.DuckDBPyConnection, resident: Slots | None = None) -> list[Sequence]:
    """Every sequence with a root, with its block table drawn as a strip of states.
    ``resident``: the GPU slots with their states when the caller has them (the map's read
    of block_table_entry), else they are read."""
    if resident is None:
        resident = tiers_and_slots(con)[2]
    seqs = _arrays(con, "report_sequences")
    ids = seqs["seq_id"].astype(np.int64, copy=False)
    if ids.size == 0:
        return []
    last: list[object] = [MAX_STRIP_BLOCKS - 1]
    roots = _arrays(con, "report_roots")  # in block_table_ptr order
    swapped = _arrays(con, "report_swapped_slots", last)
    words = _arrays(con, "report_token_blocks", last)
    drawn = (resident.index >= 0) & (resident.index < MAX_STRIP_BLOCKS)
    slot_table = np.concatenate([resident.table[drawn], swapped["block_table_id"]])
    slot_index = np.concatenate([resident.index[drawn], swapped["block_index"]])
    slot_state = np.concatenate([resident.state[drawn], np.full(swapped["block_index"].size, 3)])
    # each slot in every sequence whose root points to its block table
    root_ptr = roots["block_table_ptr"].astype(np.int64, copy=False)
    root_row = np.searchsorted(ids, roots["seq_id"].astype(np.int64, copy=False))
    ptr, first, count = np.unique(root_ptr, return_index=True, return_counts=True)
    k = np.minimum(
        np.searchsorted(ptr, slot_table.astype(np.int64, copy=False)), max(ptr.size - 1, 0)
    )
    n = np.where(ptr[k] == slot_table, count[k], 0) if ptr.size else np.zeros(k.size, np.int64)
    pick = np.repeat(np.arange(n.size), n)
    within = np.arange(pick.size) - np.repeat(np.cumsum(n) - n, n)
    located_row = root_row[first[k][pick] + within]
    located_index = slot_index.astype(np.int64, copy=False)[pick]
    located_state = slot_state.astype(np.int64, copy=False)[pick]
    # the block indexes the tokens need: the words' set bits
    bits = words["bits"].astype(np.uint64, copy=False)
    word_row, bit = np.nonzero((bits[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1))
    token_row = np.searchsorted(ids, words["seq_id"].astype(np.int64, copy=False))
    needed_row = token_row[word_row]
    needed_index = words["word"].astype(np.int64, copy=False)[word_row] * 64 + bit
    # one character a block index up to the largest a sequence has: the most severe state
    # of its locations; a needed block that no tier has is missing (5); else no block (0)
    row = np.concatenate([located_row, needed_row])
    all_index = np.concatenate([located_index, needed_index])
    length = np.zeros(ids.size, np.int64)
    np.maximum.at(length, row, all_index + 1)
    start = np.concatenate([[0], np.cumsum(length)])
    at = start[row] + all_index
    code = np.zeros(int(start[-1]), np.int64)
    np.maximum.at(code, at[: located_row.size], located_state)
    needed = np.zeros(code.size, bool)
    needed[at[located_row.size :]] = True
    code = np.where((code == 0) & needed, 5, code)
    lookup = np.zeros(max(STRIP_CODES) + 1, np.uint8)
    for c, ch in STRIP_CODES.items():
        lookup[c] = ord(ch)
    chars = lookup[code]
    tokens = np.bincount(token_row, weights=words["tokens"], minlength=ids.size).astype(
        np.int64, copy=False
    )
    text = chars.tobytes().decode("ascii")
    tables = seqs["block_tables"]
    return [
        Sequence(int(ids[i]), str(tables[i]), int(tokens[i]), text[start[i] : start[i + 1]])
        for i in range(ids.size)
    ]


def capabilities(con: duckdb.DuckDBPyConnection) -> dict[str, bool]:
    """Which capabilities' tables are in the database: engine, replay_requests, replay_log."""
    cursor = con.execute(query("report_capabilities"))
    names = [d[0] for d in cursor.description or []]
    return dict(zip(names, (bool(v) for v in cursor.fetchall()[0]), strict=True))


def request_ids(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """Request ids by seq_id: an imported engine snapshot's, else a replayed step log's."""
    found = capabilities(con)
    for capability, name in (
        ("engine", "report_engine_request_ids"),
        ("replay_requests", "report_replay_request_ids"),
    ):
        if found[capability]:
            return {int(s): str(r) for s, r in con.execute(query(name)).fetchall()}
    return {}


# a timeline is drawn with at most this many points (the largest value of each bucket)
MAX_TIMELINE_POINTS = 4000


@dataclass(frozen=True)
class StepSeries:
    steps: np.ndarray
    series: dict[str, np.ndarray]


def timeline(con: duckdb.DuckDBPyConnection) -> StepSeries | None:
    """Blocks in use per step of the stored step log (None without one), at most
    MAX_TIMELINE_POINTS points: each bucket of consecutive steps shows its largest values
    at its first step."""
    if not capabilities(con)["replay_log"]:
        return None
    a = _arrays(con, "report_timeline")
    steps = a.pop("step").astype(np.int64, copy=False)
    series = {k.replace("_", " "): v.astype(np.int64, copy=False) for k, v in a.items()}
    if steps.size > MAX_TIMELINE_POINTS:
        starts = np.arange(0, steps.size, -(-steps.size // MAX_TIMELINE_POINTS))
        series = {k: np.maximum.reduceat(v, starts) for k, v in series.items()}
        steps = steps[starts]
    return StepSeries(steps, series)
