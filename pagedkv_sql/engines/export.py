"""The stored relations as an engine's own arrays: FlashInfer's CSR page table and vLLM's
worker-side block table and slot mapping.

Both need each sequence to be a contiguous, fully resident run of tokens 0..len-1, each
at ``(pos // B, pos % B)`` in one resident block. A sequence that is not is refused, and
the reason named (a page fault, a swapped block, a hole in its tokens...); the others are
exported.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from ..dbutil import run, setting
from ..errors import PagedKVError, UsageError
from ..filesets import file_set
from ..paths import atomic_output, protect_output
from .snapshot import CacheTensor, Snapshot
from .tables import has_engine_tables

INT32_MAX = np.iinfo(np.int32).max


@dataclass
class Export:
    """What ``export`` produced: the engine's arrays as a snapshot, and the sequences it
    refused (seq_id, request id or None, reason)."""

    snapshot: Snapshot
    refused: list[tuple[int, str | None, str]] = field(default_factory=list)

    def write(
        self, directory: str | os.PathLike[str], *, database: str | None = None
    ) -> list[Path]:
        """Each array as ``NAME.npy`` (``np.load`` / ``torch.from_numpy``) and the whole
        snapshot, metadata included, as ``ENGINE.npz`` (``pagedkv-sql import`` reads it),
        as one set: all new files or the old ones (``engines.export.write_set``); never
        over the file ``database``."""
        return write_set(self.snapshot, directory, database)


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
) -> tuple[list[np.ndarray], np.ndarray | None, list[CacheTensor]]:
    """Engine block ids of each run's bases: exact from the pool an import recorded
    ((base - pool base) / block step), with that pool's cache-tensor layouts (as pool 0,
    the ids index them), else numbered densely by ascending base from ``first_dense`` (the
    bases are then returned, one per id, so nothing is lost)."""
    pool = None
    if has_engine_tables(con):
        rows = run(
            con,
            "SELECT pool_id, base, block_step FROM engine_pool WHERE tier = 'gpu' ORDER BY pool_id",
        )
        pool = rows[0] if rows else None
    if pool is not None:
        pool_id, base, step = pool
        ids = [(r.bases - base) // step for r in runs]
        exact = all(((r.bases - base) % step == 0).all() for r in runs)
        if exact and all(((i >= 0) & (i <= INT32_MAX)).all() for i in ids):
            return ids, None, _pool_tensors(con, pool_id)
    every = np.unique(np.concatenate([r.bases for r in runs])) if runs else np.empty(0, np.int64)
    if every.size + first_dense > INT32_MAX:
        raise PagedKVError(f"{every.size} distinct blocks do not fit int32 block ids")
    return [np.searchsorted(every, r.bases) + first_dense for r in runs], every, []


def _pool_tensors(con: duckdb.DuckDBPyConnection, pool_id: int) -> list[CacheTensor]:
    """The cache tensors an import recorded for pool ``pool_id``, as pool 0's: an export
    carries them, so that its import gives every block the address it had."""
    rows = run(
        con,
        "SELECT name, shape, strides, dtype, itemsize, dims, pointer, kv, layer "
        "FROM engine_cache_tensor WHERE pool_id = ? ORDER BY rowid",
        [pool_id],
    )
    return [
        CacheTensor(n, tuple(sh), tuple(st), dt, size, tuple(dims), ptr, kv, layer)
        for n, sh, st, dt, size, dims, ptr, kv, layer in rows
    ]


def kv_layout(tensors: list[CacheTensor]) -> str | None:
    """FlashInfer's name for the layout of these tensors: ``HND`` where a page's heads come
    before its slots, ``NHD`` where its slots (or flat tokens) come first; None without
    tensors."""
    if not tensors:
        return None
    dims = tensors[0].dims
    slot = dims.index("slot") if "slot" in dims else dims.index("token")
    return "HND" if "head" in dims and dims.index("head") < slot else "NHD"


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
    ids, bases, tensors = _block_ids(con, runs, 0)
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
    layout = kv_layout(tensors)
    if layout is not None:
        meta["kv_layout"] = layout
    return Export(Snapshot("flashinfer", arrays, meta, tensors), refused)


def vllm(con: duckdb.DuckDBPyConnection) -> Export:
    """vLLM v1's worker-side arrays: block_table int32 [num_reqs, max_num_blocks_per_req]
    (padded with 0, the null block), num_blocks_per_row int32, slot_mapping int64 (one
    slot a token, requests in row order: block_id * block_size + pos % block_size)."""
    block_size = int(setting(con, "block_size") or 16)
    runs, refused = resident_runs(con, block_size)
    ids, bases, tensors = _block_ids(con, runs, 1)
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
    return Export(Snapshot("vllm", arrays, meta, tensors), refused)


# -- writing a set of files: all of it, or the old set stays ---------------------------------

MANIFEST = ".pagedkv-export.json"
# the names an export of each engine may write (an earlier pagedkv wrote no manifest)
SET_NAMES = {
    "flashinfer": {"kv_indptr", "kv_indices", "kv_last_page_len", "pagedkv_page_base"},
    "vllm": {
        "block_table",
        "num_blocks_per_row",
        "slot_mapping",
        "num_tokens",
        "pagedkv_block_base",
    },
}
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _engine_of(name: str) -> str | None:
    """The engine whose export writes a file called ``name``, if any."""
    stem, _, suffix = name.rpartition(".")
    for engine, arrays in SET_NAMES.items():
        if (suffix == "npy" and stem in arrays) or name == f"{engine}.npz":
            return engine
    return None


def _is_export_file(directory: Path, name: str) -> bool:
    """A regular file (not a link) that starts as ``.npy`` or ``.npz`` files do."""
    path = directory / name
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return False
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head.startswith(_NPY_MAGIC if name.endswith(".npy") else _ZIP_MAGIC)


def _previous_sets(directory: Path, database: str | None) -> dict[str, list[str]]:
    """The export sets in ``directory`` (engine -> its file names), refusing a directory
    that holds anything else: the set is swapped in as a whole directory, so whatever
    else is in it (a database, notes) would go with the old set."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise UsageError(f"cannot write to {directory}: {e.strerror or e}") from None
    sets: dict[str, list[str]] = {}
    foreign = []
    for name in names:
        if database and database != ":memory:":
            protect_output(directory / name, database)
        engine = None if name == MANIFEST else _engine_of(name)
        if engine is not None and _is_export_file(directory, name):
            sets.setdefault(engine, []).append(name)
        elif name != MANIFEST:
            foreign.append(name)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if foreign[3:] else "")
        raise UsageError(
            f"refusing to export into {directory}: it holds {shown}, not a pagedkv-sql "
            "export (an export replaces the whole directory, so that its files are one set)",
            hint="choose a new or empty --output directory, or one an export wrote",
        )
    return sets


def check_target(
    directory: str | os.PathLike[str],
    engine: str,
    database: str | None = None,
    arrays: Iterable[str] | None = None,
) -> tuple[Path, dict[str, list[str]]]:
    """Refuse an export directory that is, or would write over, the database (or holds
    what is not an export), before any work is done: the real path and the sets already
    in it. ``arrays``: the array names (default: the engine's set)."""
    target = Path(os.path.realpath(directory))
    names = SET_NAMES[engine] if arrays is None else arrays
    if database and database != ":memory:":
        for name in [*(f"{n}.npy" for n in names), f"{engine}.npz"]:
            protect_output(target / name, database)
        protect_output(target, database)
    return target, _previous_sets(target, database)


def write_set(
    snapshot: Snapshot, directory: str | os.PathLike[str], database: str | None = None
) -> list[Path]:
    """Write each array as ``NAME.npy`` and the whole snapshot as ``ENGINE.npz`` into
    ``directory``, as one set: the files are written (and fsynced) into a new directory
    beside it, which then takes the place of ``directory`` in one atomic exchange
    (``filesets.file_set``). A full disk, an error or a kill before that leaves the old
    directory exactly as it was; another engine's export already there is carried over
    (hard links). ``database`` (the path being exported) is never written over or moved."""
    target, previous = check_target(directory, snapshot.engine, database, snapshot.arrays)
    lock, begun = -1, False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep_drafts(target)
        with file_set(target) as draft:
            lock = os.open(draft, os.O_RDONLY | os.O_DIRECTORY)
            begun = True
            fcntl.flock(lock, fcntl.LOCK_EX)  # held until done: no other export sweeps it
            return _fill(snapshot, target, draft, previous)
    except (OSError, PagedKVError) as e:
        why = e.strerror if isinstance(e, OSError) else str(e).rpartition(": ")[2]
        if not begun:
            raise UsageError(
                f"cannot write to {target}: {why or e}",
                hint="--output names a directory to create or fill",
            ) from None
        raise PagedKVError(
            f"cannot write {target}: {why or e}; it was left as it was, no file changed"
        ) from None
    finally:
        if lock >= 0:
            os.close(lock)


def _sweep_drafts(target: Path) -> None:
    """Remove what killed exports to ``target`` left beside it: directories named
    ``.NAME.<12 hex>.part`` (or ``.part.old``), this user's, whose lock is free, holding
    nothing but files an export writes (its arrays, its manifest, their temp names)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[0-9a-f]{{12}}\.part(?:\.old)?")
    for name in sorted(os.listdir(target.parent)):
        if not pattern.fullmatch(name):
            continue
        path = target.parent / name
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            names = os.listdir(fd)
            if all(_draft_file(fd, entry) for entry in names):
                for entry in names:
                    os.unlink(entry, dir_fd=fd)
                os.rmdir(path)
        except OSError:
            pass
        finally:
            os.close(fd)


_TEMP_NAME = re.compile(r"\.(.+)\.[0-9a-f]{12}\.part")


def _draft_file(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is a regular file of a name an export writes (or its temp name)."""
    if match := _TEMP_NAME.fullmatch(name):
        name = match[1]
    if name != MANIFEST and _engine_of(name) is None:
        return False
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _fill(
    snapshot: Snapshot, target: Path, draft: Path, previous: dict[str, list[str]]
) -> list[Path]:
    """The new set in ``draft``: the other engines' sets linked from ``target``, this
    engine's arrays and snapshot, the manifest listing them; the paths it will have."""
    written: list[Path] = []
    listing: dict[str, list[str]] = {}
    for engine, names in previous.items():
        if engine != snapshot.engine:
            for name in names:
                os.link(target / name, draft / name)
            listing[engine] = names
    for name, array in snapshot.arrays.items():
        with atomic_output(draft / f"{name}.npy") as f:
            np.save(f, array)
        written.append(target / f"{name}.npy")
    snapshot.save(draft / f"{snapshot.engine}.npz")
    written.append(target / f"{snapshot.engine}.npz")
    listing[snapshot.engine] = sorted(p.name for p in written)
    with atomic_output(draft / MANIFEST) as f:
        f.write(json.dumps({"format": 1, "sets": listing}, sort_keys=True).encode())
    return written
