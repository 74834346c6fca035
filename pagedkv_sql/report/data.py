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

    def __len__(self) -> int:
        return int(self.address.size)


def tier_blocks(con: duckdb.DuckDBPyConnection) -> tuple[TierBlocks, TierBlocks]:
    """The GPU and CPU tiers' blocks."""
    g = _arrays(con, "report_gpu_blocks")
    gpu = TierBlocks(
        "gpu",
        g["address"].astype(np.int64),
        g["holders"].astype(np.int64),
        g["refcount"].astype(np.int64),
        g["seq_id"].astype(np.int64),
        g["orphan"].astype(bool),
        g["mismatch"].astype(bool),
    )
    c = _arrays(con, "report_cpu_blocks")
    n = c["address"].size
    cpu = TierBlocks(
        "cpu",
        c["address"].astype(np.int64),
        c["holders"].astype(np.int64),
        np.zeros(n, np.int64),
        c["seq_id"].astype(np.int64),
        c["orphan"].astype(bool),
        np.zeros(n, bool),
    )
    return gpu, cpu


@dataclass(frozen=True)
class Sequence:
    seq_id: int
    block_tables: str
    tokens: int
    strip: str  # one character a logical block, STRIP_CODES


def sequences(con: duckdb.DuckDBPyConnection) -> list[Sequence]:
    """Every sequence with a root, with its block table drawn as a strip of states."""
    seqs = _arrays(con, "report_sequences")
    blocks = _arrays(con, "report_logical_blocks", [MAX_STRIP_BLOCKS - 1])
    ids = seqs["seq_id"].astype(np.int64)
    if ids.size == 0:
        return []
    row = np.searchsorted(ids, blocks["seq_id"])
    index = blocks["block_index"].astype(np.int64)
    length = np.zeros(ids.size, np.int64)
    np.maximum.at(length, row, index + 1)
    tokens = np.bincount(row, weights=blocks["tokens"], minlength=ids.size).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(length)])
    chars = np.full(int(start[-1]), ord("."), np.uint8)
    lookup = np.zeros(max(STRIP_CODES) + 1, np.uint8)
    for code, ch in STRIP_CODES.items():
        lookup[code] = ord(ch)
    chars[start[row] + index] = lookup[blocks["state"].astype(np.int64)]
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
    steps = a.pop("step").astype(np.int64)
    series = {k.replace("_", " "): v.astype(np.int64) for k, v in a.items()}
    if steps.size > MAX_TIMELINE_POINTS:
        starts = np.arange(0, steps.size, -(-steps.size // MAX_TIMELINE_POINTS))
        series = {k: np.maximum.reduceat(v, starts) for k, v in series.items()}
        steps = steps[starts]
    return StepSeries(steps, series)
