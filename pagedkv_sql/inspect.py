"""`explain` (the resolution path of one token) and `stats` (the shape of the cache)."""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from .check import request_labels
from .dbutil import run
from .kv_groups import GroupStats, group_stats
from .sqlfiles import statement


@dataclass(frozen=True)
class Hop:
    """One way a token's decomposition meets a block table."""

    block_table_ptr: int
    block_index: int
    offset_in_block: int
    resident: list[tuple[int, int]]  # (physical_block_base, refcount)
    swapped: list[int]  # cpu_base_address


@dataclass(frozen=True)
class Resolution:
    tier: str  # "gpu" | "cpu"
    base: int
    offset_in_block: int
    physical_address: int


@dataclass(frozen=True)
class Explanation:
    seq_id: int
    token_pos: int
    decompositions: list[tuple[int, int]]
    roots: list[int]
    hops: list[Hop]
    resolutions: list[Resolution] = field(default_factory=list)
    broken: str | None = None  # where resolution stops, when it does
    request_id: str | None = None  # the engine's id of the sequence, after an import

    @property
    def addresses(self) -> list[int]:
        return sorted({r.physical_address for r in self.resolutions})


def explain(con: duckdb.DuckDBPyConnection, seq_id: int, token_pos: int) -> Explanation:
    decompositions = [
        tuple(r) for r in run(con, statement("explain_decompositions"), [seq_id, token_pos])
    ]
    roots = [r[0] for r in run(con, statement("explain_roots"), [seq_id])]
    hops: list[Hop] = []
    resolutions: list[Resolution] = []
    for block_index, offset in decompositions:
        for ptr in roots:
            key = [offset, ptr, block_index]
            resident = run(con, statement("explain_resident"), key)
            swapped = run(con, statement("explain_swapped"), key)
            hops.append(
                Hop(
                    ptr,
                    block_index,
                    offset,
                    [(b, r) for b, r, _ in resident],
                    [c for c, _ in swapped],
                )
            )
            resolutions += [Resolution("gpu", b, offset, a) for b, _, a in resident]
            resolutions += [Resolution("cpu", c, offset, a) for c, a in swapped]
    broken = None
    if not decompositions:
        broken = f"no virtual_token row for seq_id {seq_id}, token_pos {token_pos}"
    elif not roots:
        broken = f"no root_table row for seq_id {seq_id}"
    elif not resolutions:
        blocks = ", ".join(
            f"block {h.block_index} of block table {h.block_table_ptr}" for h in hops
        )
        broken = f"{blocks}: neither resident (block_table_entry) nor swapped (swapped_block)"
    return Explanation(
        seq_id,
        token_pos,
        decompositions,
        roots,
        hops,
        resolutions,
        broken,
        request_labels(con, [seq_id]).get(seq_id),
    )


@dataclass(frozen=True)
class PoolStats:
    """One engine pool's blocks, in disjoint groups (sql/inspect.sql, ``pool_stats``);
    None where the import recorded nothing to count them from."""

    pool_id: int
    name: str
    tier: str
    blocks: int | None  # the pool's size
    held: int  # in a request's block list (or a radix-tree page a request locks)
    cached: int  # kept by the prefix cache, held by no request: reclaimable
    free: int | None  # in the free list, not cached (else the allocator's own count)
    reserved: int  # the null block, the padding page
    unaccounted: int | None  # in none of the above: leaked, where every block is accounted

    def rows(self) -> list[tuple[str, int | None]]:
        """(label, value) per figure, as `stats` prints them."""
        head = f"pool {self.pool_id} ({self.name})"
        return [
            (f"{head} blocks", self.blocks),
            (f"{head} held by requests", self.held),
            (f"{head} cached, reclaimable", self.cached),
            (f"{head} free", self.free),
            (f"{head} reserved", self.reserved),
            (f"{head} unaccounted", self.unaccounted),
        ]


@dataclass(frozen=True)
class Stats:
    counts: dict[str, int]
    refcount_histogram: list[tuple[int, int]]  # (refcount, physical blocks)
    pools: tuple[PoolStats, ...] = ()  # after an engine import: each pool's blocks
    groups: tuple[GroupStats, ...] = ()  # after an engine import: each KV-cache group


def stats(con: duckdb.DuckDBPyConnection, block_size: int) -> Stats:
    cursor = con.execute(statement("stats"), [block_size])
    names = [d[0] for d in cursor.description or []]
    row = cursor.fetchall()[0]
    histogram = [(int(a), int(b)) for a, b in run(con, statement("refcount_histogram"))]
    counts = {n: int(v) for n, v in zip(names, row, strict=True)}
    return Stats(counts, histogram, pool_stats(con), group_stats(con))


def pool_stats(con: duckdb.DuckDBPyConnection) -> tuple[PoolStats, ...]:
    """Each engine pool's blocks, while the engine tables hold an import (none else)."""
    has_pools = run(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'engine_pool'")[
        0
    ][0]
    if not has_pools:
        return ()
    return tuple(PoolStats(*row) for row in run(con, statement("pool_stats")))
