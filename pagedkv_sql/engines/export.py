"""The stored relations as an engine's own arrays: FlashInfer's CSR page table and vLLM's
worker-side block table and slot mapping.

Both need each sequence to be a contiguous, fully resident run of tokens 0..len-1, each
at ``(pos // B, pos % B)`` in one resident block. A sequence that is not is refused, and
the reason named (a page fault, a swapped block, a hole in its tokens...); the others are
exported.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

from ..dbutil import run, setting
from ..errors import PagedKVError
from . import Export
from .snapshot import Snapshot
from .tables import has_engine_tables

INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class Run:
    """One exportable sequence: its tokens and the base of each of its blocks."""

    seq_id: int
    request_id: str | None
    num_tokens: int
    bases: np.ndarray  # int64, one per block 0..ceil(num_tokens / B) - 1


def _column(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[int] | None = None
) -> list[np.ndarray]:
    table = con.sql(sql, params=params).to_arrow_table()
    return [c.to_numpy() for c in table.columns]


def resident_runs(
    con: duckdb.DuckDBPyConnection, block_size: int
) -> tuple[list[Run], list[tuple[int, str | None, str]]]:
    """Every sequence as a Run, or refused with the reason."""
    requests = _request_ids(con)
    seqs, roots = _column(
        con,
        "SELECT seq_id, count(DISTINCT block_table_ptr) FROM ("
        "SELECT seq_id, block_table_ptr FROM root_table UNION ALL "
        "SELECT DISTINCT seq_id, NULL FROM virtual_token) GROUP BY seq_id ORDER BY seq_id",
    )
    t_seq, t_rows, t_tokens, t_lo, t_hi, t_misplaced = _column(
        con,
        "SELECT seq_id, count(*), count(DISTINCT token_pos), min(token_pos), max(token_pos), "
        "count(*) FILTER (WHERE block_index <> token_pos // $1 "
        "OR offset_in_block <> token_pos % $1) FROM virtual_token GROUP BY seq_id "
        "ORDER BY seq_id",
        [block_size],
    )
    e_seq, e_block, e_base = _column(
        con,
        "SELECT r.seq_id, e.block_index, e.physical_block_base FROM root_table r "
        "JOIN block_table_entry e ON e.block_table_id = r.block_table_ptr ORDER BY ALL",
    )
    s_seq, s_block = _column(
        con,
        "SELECT DISTINCT r.seq_id, s.block_index FROM root_table r "
        "JOIN swapped_block s ON s.block_table_id = r.block_table_ptr ORDER BY ALL",
    )
    runs: list[Run] = []
    refused: list[tuple[int, str | None, str]] = []
    for seq_id, root_count in zip(seqs.tolist(), roots.tolist(), strict=True):
        rid = requests.get(seq_id)
        i = int(np.searchsorted(t_seq, seq_id))
        has_tokens = i < t_seq.size and t_seq[i] == seq_id
        tokens = int(t_tokens[i]) if has_tokens else 0
        reason = None
        if root_count != 1:
            reason = (
                "no root_table row (no block table)"
                if root_count == 0
                else f"{root_count} block tables for one sequence"
            )
        elif tokens == 0:
            reason = "no tokens"
        elif t_rows[i] != tokens:
            reason = f"{t_rows[i] - tokens} token(s) with more than one decomposition"
        elif t_lo[i] != 0 or t_hi[i] != tokens - 1:
            reason = f"hole: {tokens} token(s) in positions {t_lo[i]}..{t_hi[i]}, not a run from 0"
        elif t_misplaced[i]:
            reason = f"{t_misplaced[i]} token(s) not at (pos // {block_size}, pos % {block_size})"
        if reason is None:
            lo, hi = np.searchsorted(e_seq, [seq_id, seq_id + 1])
            blocks, bases = e_block[lo:hi], e_base[lo:hi]
            n_blocks = -(-tokens // block_size)
            inside = (blocks >= 0) & (blocks < n_blocks)
            counts = np.bincount(blocks[inside], minlength=n_blocks)
            if (counts == 0).any():
                b = int(np.flatnonzero(counts == 0)[0])
                slo, shi = np.searchsorted(s_seq, [seq_id, seq_id + 1])
                if b in set(s_block[slo:shi].tolist()):
                    reason = f"swapped: block {b} is on the CPU (swapped_block), not resident"
                else:
                    reason = (
                        f"page fault: block {b} (tokens {b * block_size}..) is neither "
                        "resident nor swapped"
                    )
            elif (counts > 1).any():
                b = int(np.flatnonzero(counts > 1)[0])
                reason = f"block {b} has {counts[b]} different GPU bases"
            else:
                runs.append(Run(seq_id, rid, tokens, bases[inside]))
                continue
        refused.append((seq_id, rid, reason))
    return runs, refused


def _request_ids(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    if not has_engine_tables(con):
        return {}
    return dict(run(con, "SELECT seq_id, request_id FROM engine_request"))


def _block_ids(
    con: duckdb.DuckDBPyConnection, runs: list[Run], first_dense: int
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Engine block ids of each run's bases: exact from the pool an import recorded
    ((base - pool base) / block step), else numbered densely by ascending base from
    ``first_dense`` (the bases are then returned, one per id, so nothing is lost)."""
    pool = None
    if has_engine_tables(con):
        rows = run(
            con, "SELECT base, block_step FROM engine_pool WHERE tier = 'gpu' ORDER BY pool_id"
        )
        pool = rows[0] if rows else None
    if pool is not None:
        base, step = pool
        ids = [(r.bases - base) // step for r in runs]
        exact = all(((r.bases - base) % step == 0).all() for r in runs)
        if exact and all(((i >= 0) & (i <= INT32_MAX)).all() for i in ids):
            return ids, None
    every = np.unique(np.concatenate([r.bases for r in runs])) if runs else np.empty(0, np.int64)
    if every.size + first_dense > INT32_MAX:
        raise PagedKVError(f"{every.size} distinct blocks do not fit int32 block ids")
    return [np.searchsorted(every, r.bases) + first_dense for r in runs], every


def _meta(
    runs: list[Run], refused: list[tuple[int, str | None, str]], block_size: int
) -> dict[str, object]:
    return {
        "block_size": block_size,
        "page_size": block_size,
        "seq_ids": [r.seq_id for r in runs],
        "request_ids": [r.request_id if r.request_id is not None else str(r.seq_id) for r in runs],
        "refused": [{"seq_id": s, "request_id": q, "reason": why} for s, q, why in refused],
    }


def flashinfer(con: duckdb.DuckDBPyConnection) -> Export:
    """kv_indptr, kv_indices, kv_last_page_len (int32) and page_size."""
    block_size = int(setting(con, "block_size") or 16)
    runs, refused = resident_runs(con, block_size)
    ids, bases = _block_ids(con, runs, 0)
    pages = np.array([len(i) for i in ids], dtype=np.int64)
    indptr = np.zeros(len(runs) + 1, dtype=np.int32)
    np.cumsum(pages, out=indptr[1:], dtype=np.int64)
    indices = np.concatenate(ids).astype(np.int32) if ids else np.empty(0, np.int32)
    last = np.array(
        [r.num_tokens - (len(i) - 1) * block_size for r, i in zip(runs, ids, strict=True)],
        dtype=np.int32,
    )
    arrays = {"kv_indptr": indptr, "kv_indices": indices, "kv_last_page_len": last}
    if bases is not None:
        arrays["pagedkv_page_base"] = bases.astype(np.int64)
    meta = _meta(runs, refused, block_size)
    return Export(Snapshot("flashinfer", arrays, meta), refused)


def vllm(con: duckdb.DuckDBPyConnection) -> Export:
    """vLLM v1's worker-side arrays: block_table int32 [num_reqs, max_num_blocks_per_req]
    (padded with 0, the null block), num_blocks_per_row int32, slot_mapping int64 (one
    slot a token, requests in row order: block_id * block_size + pos % block_size)."""
    block_size = int(setting(con, "block_size") or 16)
    runs, refused = resident_runs(con, block_size)
    ids, bases = _block_ids(con, runs, 1)
    per_row = np.array([len(i) for i in ids], dtype=np.int32)
    width = int(per_row.max()) if per_row.size else 0
    table = np.zeros((len(runs), width), dtype=np.int32)
    for row, i in enumerate(ids):
        table[row, : len(i)] = i
    slots = []
    for r, i in zip(runs, ids, strict=True):
        pos = np.arange(r.num_tokens, dtype=np.int64)
        slots.append(i[pos // block_size].astype(np.int64) * block_size + pos % block_size)
    arrays = {
        "block_table": table,
        "num_blocks_per_row": per_row,
        "slot_mapping": np.concatenate(slots) if slots else np.empty(0, np.int64),
        # each row's tokens, so that the arrays import again (pagedkv_sql.engines.vllm)
        "num_tokens": np.array([r.num_tokens for r in runs], dtype=np.int64),
    }
    if bases is not None:
        arrays["pagedkv_block_base"] = bases.astype(np.int64)
    meta = _meta(runs, refused, block_size)
    return Export(Snapshot("vllm", arrays, meta), refused)


EXPORTERS = {"flashinfer": flashinfer, "vllm": vllm}
