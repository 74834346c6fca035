"""The KV-cache groups an engine import recorded (vLLM's sliding-window, hybrid and Mamba
models: engine_kv_group), as the core reads them, with SQL alone: `stats`' figures a group,
and the group `resolve --group N` names, checked (docs/engines.md, "KV-cache groups").
Before any import, or after one of an engine that records no groups, there are none."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from .dbutil import run, scalar
from .errors import UsageError
from .sqlfiles import statement


@dataclass(frozen=True)
class GroupStats:
    """One KV-cache group (sql/inspect.sql, ``kv_group_stats``)."""

    group_id: int
    kind: str | None  # None: the snapshot did not record it
    block_size: int
    window: int | None  # the sliding window, or the chunk of chunked local attention
    layers: tuple[str, ...]
    primary: bool  # the spec's relations are this group's
    requests: int  # requests with an entry in the group
    entries: int  # block-list entries, placeholders included
    blocks: int  # distinct blocks the entries hold
    placeholders: int  # entries holding no block (the null block, a hole)

    @property
    def title(self) -> str:
        """``group 1 (sliding_window 64, block size 32)``, ``, primary`` for the spec's."""
        kind = self.kind or "kind not recorded"
        window = f" {self.window}" if self.window is not None else ""
        primary = ", the spec's relations" if self.primary else ""
        size = f"block size {self.block_size}"
        return f"KV-cache group {self.group_id} ({kind}{window}, {size}{primary})"

    def rows(self) -> list[tuple[str, int]]:
        """(label, value) per figure, as `stats` prints them."""
        return [
            (f"{self.title} layers", len(self.layers)),
            (f"{self.title} requests", self.requests),
            (f"{self.title} blocks held", self.blocks),
            (f"{self.title} entries without a block", self.placeholders),
        ]


def recorded(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database has the KV-cache groups table an engine import creates."""
    sql = "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'engine_kv_group'"
    return bool(scalar(con, sql))


def group_stats(con: duckdb.DuckDBPyConnection) -> tuple[GroupStats, ...]:
    """Every recorded group, in group order; none without an import that records them."""
    if not recorded(con):
        return ()
    return tuple(
        GroupStats(g, kind, size, window, tuple(layers), primary, *counts)
        for g, kind, size, window, layers, primary, *counts in run(con, statement("kv_group_stats"))
    )


def check_group(con: duckdb.DuckDBPyConnection, group: int) -> None:
    """A ``UsageError`` unless ``group`` is a group of the imported engine state whose
    tokens have addresses: every block list's group of an engine import (vLLM's KV-cache
    groups; other engines' group 0, TensorRT-LLM's pools), not a Mamba group (its blocks
    hold a request's state, not tokens)."""
    if isinstance(group, bool) or not isinstance(group, int):
        raise UsageError(f"group must be an integer, not {group!r}")
    have = "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'engine_block_table'"
    if not scalar(con, have) or not recorded(con):
        raise UsageError(
            "resolve --group reads an engine import's block lists: this database has none",
            hint="import an engine snapshot first (pagedkv-sql import vllm SNAPSHOT)",
        )
    groups = sorted(
        {int(g) for (g,) in run(con, "SELECT DISTINCT group_id FROM engine_block_table")}
        | {int(g) for (g,) in run(con, "SELECT group_id FROM engine_kv_group")}
    )
    if group not in groups:
        known = ", ".join(map(str, groups)) or "none"
        raise UsageError(f"no KV-cache group {group} in the imported state; groups: {known}")
    kind = run(con, "SELECT kind FROM engine_kv_group WHERE group_id = ?", [group])
    if kind and kind[0][0] == "mamba":
        raise UsageError(
            f"KV-cache group {group} is a mamba group: its blocks hold each request's state, "
            "not tokens, so its tokens have no addresses",
            hint="`pagedkv-sql stats` lists the groups and their kinds",
        )
