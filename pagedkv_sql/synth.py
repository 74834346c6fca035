"""A realistic synthetic KV cache, vectorised with numpy: 10 million tokens in seconds.

S sequences with lengths spread around a mean; block size B tokens; a fraction of
sequences fork from the previous one and share half of its blocks (refcount = holders); a
fraction of logical blocks swapped to CPU, a fraction missing; optional 64-bit addresses
and injected anomalies for the diagnostics. The same seed gives the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa

from .errors import PagedKVError, UsageError
from .filesets import file_set, new_directory
from .limits import MAX_BLOCK_SIZE
from .relations import INPUT_RELATIONS, arrow_schema

GPU_BASE = 0x1000_0000
CPU_BASE = 0x7000_0000
WIDE = 1 << 44  # addresses above 2^44 with --wide-addresses
# sequences x mean length: about 100 bytes of memory a token while synthesizing
MAX_TOKENS = 100_000_000
MAX_ANOMALIES = 1_000_000


@dataclass(frozen=True)
class SynthConfig:
    sequences: int = 1000
    mean_length: int = 1000
    block_size: int = 16
    fork_fraction: float = 0.2
    swap_fraction: float = 0.05
    missing_fraction: float = 0.0
    wide_addresses: bool = False
    anomalies: int = 0
    seed: int = 0


def synthesize(config: SynthConfig) -> dict[str, pa.Table]:
    c = config
    if c.sequences < 1 or c.mean_length < 1 or not 1 <= c.block_size <= MAX_BLOCK_SIZE:
        raise UsageError(
            f"need sequences >= 1, mean length >= 1 and 1 <= block size <= {MAX_BLOCK_SIZE}"
        )
    if c.sequences * c.mean_length > MAX_TOKENS:
        raise UsageError(
            f"{c.sequences} sequences of {c.mean_length} tokens on average make more than "
            f"{MAX_TOKENS:,} tokens, more than synth builds in memory",
            hint="make fewer or shorter sequences, and load several seeds with --append",
        )
    if not 0 <= c.anomalies <= MAX_ANOMALIES:
        raise UsageError(f"anomalies must be within [0, {MAX_ANOMALIES:,}], not {c.anomalies}")
    if not 0 <= c.seed < 2**63:
        raise UsageError(f"seed must be within [0, 2^63), not {c.seed}")
    for name in ("fork_fraction", "swap_fraction", "missing_fraction"):
        if not 0.0 <= getattr(c, name) <= 1.0:
            raise UsageError(f"{name.replace('_', ' ')} must be within [0, 1]")
    rng = np.random.default_rng(c.seed)
    seqs = np.arange(c.sequences, dtype=np.int64)
    lengths = np.maximum(1, rng.normal(c.mean_length, c.mean_length / 4, c.sequences))
    lengths = lengths.astype(np.int64)
    nblocks = (lengths + c.block_size - 1) // c.block_size
    start = np.cumsum(nblocks) - nblocks
    block_seq = np.repeat(seqs, nblocks)
    block_idx = np.arange(block_seq.size, dtype=np.int64) - np.repeat(start, nblocks)

    # forks share the first half of their parent's blocks
    forked = (rng.random(c.sequences) < c.fork_fraction) & (seqs > 0)
    shared_len = np.where(forked, np.minimum(nblocks, np.roll(nblocks, 1)) // 2, 0)
    phys = np.arange(block_seq.size, dtype=np.int64)
    shared = block_idx < shared_len[block_seq]
    source = np.where(shared, start[np.maximum(block_seq - 1, 0)] + block_idx, 0)
    while True:  # chains of forks: follow until stable
        updated = np.where(shared, phys[source], phys)
        if np.array_equal(updated, phys):
            break
        phys = updated

    roll = rng.random(block_seq.size)
    swapped = roll < c.swap_fraction
    missing = (~swapped) & (roll < c.swap_fraction + c.missing_fraction)
    resident = ~(swapped | missing)
    offset = WIDE if c.wide_addresses else 0
    base = offset + GPU_BASE + phys * 256
    holders = np.bincount(phys[resident], minlength=phys.size)
    refcount = holders[phys]
    cpu = offset + CPU_BASE + np.arange(int(swapped.sum()), dtype=np.int64) * 256

    token_seq = np.repeat(seqs, lengths)
    token_pos = np.arange(token_seq.size, dtype=np.int64) - np.repeat(
        np.cumsum(lengths) - lengths, lengths
    )
    tables = {
        "root_table": [seqs, seqs + 100],
        "block_table_entry": [
            block_seq[resident] + 100,
            block_idx[resident],
            base[resident],
            refcount[resident],
        ],
        "virtual_token": [
            token_seq,
            token_pos,
            token_pos // c.block_size,
            token_pos % c.block_size,
        ],
        "swapped_block": [block_seq[swapped] + 100, block_idx[swapped], cpu],
    }
    if c.anomalies:
        _inject(tables, c.anomalies, c.block_size, rng)
    return {
        r: pa.Table.from_arrays([pa.array(a, pa.int64()) for a in cols], schema=arrow_schema(r))
        for r, cols in tables.items()
    }


def _inject(
    tables: dict[str, list[np.ndarray]], n: int, block_size: int, rng: np.random.Generator
) -> None:
    """n of each: a refcount off by one, an orphan block table, a token in no block (of a
    sequence without a block table, decomposed right for the block size: no other
    anomaly)."""
    bte = tables["block_table_entry"]
    entries = bte[0].size
    if entries:
        picks = rng.choice(entries, size=min(n, entries), replace=False)
        bte[3] = bte[3].copy()
        bte[3][picks] += 1
    orphans = np.arange(n, dtype=np.int64) + 10**12
    tables["block_table_entry"] = [
        np.concatenate([bte[0], orphans]),
        np.concatenate([bte[1], np.zeros(n, np.int64)]),
        np.concatenate([bte[2], GPU_BASE + (10**9 + np.arange(n, dtype=np.int64)) * 256]),
        np.concatenate([bte[3], np.ones(n, np.int64)]),
    ]
    vt = tables["virtual_token"]
    lost = np.full(n, -1, dtype=np.int64)
    pos = np.arange(n, dtype=np.int64)
    tables["virtual_token"] = [
        np.concatenate([vt[0], lost]),
        np.concatenate([vt[1], pos]),
        np.concatenate([vt[2], pos // block_size]),
        np.concatenate([vt[3], pos % block_size]),
    ]


def write(tables: dict[str, pa.Table], out_dir: Path, fmt: str = "facts") -> list[Path]:
    """Write one file for each relation given, in a load format: all of them or none (the
    set is written into a draft and moved into place once every file is complete; a
    directory made for it is removed again when it fails)."""
    if fmt not in ("facts", "tsv", "csv", "parquet", "arrow"):
        raise UsageError(f"synth writes facts, tsv, csv, parquet or arrow, not {fmt}")
    relations = [r for r in INPUT_RELATIONS if r in tables]
    names = [f"{relation}.{fmt}" for relation in relations]
    # a directory made for the set goes again if the set fails (an interrupt, a full disk)
    with new_directory(out_dir), file_set(out_dir, names) as draft:
        for relation, name in zip(relations, names, strict=True):
            try:
                with open(draft / name, "wb") as f:
                    _write_one(tables[relation], f, fmt)
            except OSError as e:
                raise PagedKVError(f"cannot write {out_dir / name}: {e.strerror or e}") from None
    return [out_dir / name for name in names]


def _write_one(table: pa.Table, f: IO[bytes], fmt: str) -> None:
    """One relation in one load format, as every command writes it (pagedkv_sql/output.py:
    tsv and csv with a bare header line, arrow an IPC file)."""
    from .output import write_table

    write_table(table, fmt, f)
