"""KV-cache groups, in one place (docs/architecture.md, "Where KV-cache groups live"): the
kinds of group, the window key of each kind, the kinds replay checks, the kinds whose chains
of KV events have gaps, and the span of tokens a group keeps (the SQL macro
``pagedkv_kept_start`` of sql/kv_groups.sql, which sql/engines.sql and sql/replay.sql both
call, and ``kept_start``, its numpy twin for the fast check); and, read with SQL alone, the
groups an engine import recorded (engine_kv_group: vLLM's sliding-window, hybrid and Mamba
models, SGLang's sliding-window and Mamba pools): `stats`' figures a group, and the group
`resolve --group N` names, checked (docs/engines.md, "KV-cache groups"). Before any import,
or after one of an engine that records no groups, there are none.

Standard library only at import (engines/, replay/ and live/ import it; the live checker
loads neither DuckDB nor numpy): what needs them is imported by the function that does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import UsageError
from .sqlfiles import statement, statements_in

if TYPE_CHECKING:
    import duckdb
    import numpy as np

# The kinds of group, named as vLLM's KVCacheSpecKind (engines/groups.py reads them from
# a snapshot, engines/vllm.py from vLLM's spec classes, engines/sglang_swa.py and
# engines/sglang_mamba.py from SGLang's pools; sql/engines.sql's engine_kv_group CHECKs them)
FULL_ATTENTION = "full_attention"  # every token kept
SLIDING_WINDOW = "sliding_window"  # the last W tokens
CHUNKED_LOCAL = "chunked_local_attention"  # the current chunk of C tokens
MAMBA = "mamba"  # per-request state blocks, not tokens
KINDS = (FULL_ATTENTION, SLIDING_WINDOW, CHUNKED_LOCAL, MAMBA)
# the kinds that keep a window, and the key of its size in tokens (a snapshot's metadata
# kv_cache_groups, a step log's header groups)
WINDOW_KEYS = {SLIDING_WINDOW: "sliding_window", CHUNKED_LOCAL: "attention_chunk_size"}
# the kinds whose blocks hold tokens (a Mamba group's hold a request's state): the groups
# whose kept tokens need a block (diag_engine_group_token_missing)
TOKEN_KINDS = (FULL_ATTENTION, SLIDING_WINDOW, CHUNKED_LOCAL)
# the kinds of group replay checks (their window frees and placeholders: docs/replay.md,
# "KV-cache groups"); a log with another is refused by name (the engine rewrites a Mamba
# group's block tables in place)
REPLAYED_KINDS = TOKEN_KINDS
# the kinds of group whose stored chain of KV events has gaps, as vLLM's events name them
# (kv_cache_spec_kind; its MLA window is sliding_window_mla): blocks outside the window (or
# before the last Mamba state) are freed while the request runs and not all are hashed, so
# a BlockStored's parent may be gone (live/checker.py's unknown_parent skips them)
GAPPED_CHAINS = frozenset((SLIDING_WINDOW, "sliding_window_mla", CHUNKED_LOCAL, MAMBA))

SQL_FILE = "kv_groups.sql"


def create_macros(con: duckdb.DuckDBPyConnection) -> None:
    """The groups' macros (sql/kv_groups.sql: ``pagedkv_kept_start``), created or
    replaced: before sql/engines.sql's views and sql/replay.sql's queries, which call it."""
    from .dbutil import run

    for stmt in statements_in(SQL_FILE):
        run(con, stmt.sql)


def macros_text() -> str:
    """The text of the groups' macros (a part of the engine views' version stamp)."""
    return "\n".join(s.sql for s in statements_in(SQL_FILE))


def kept_start(
    kind: Sequence[str | None], window: np.ndarray, has_window: np.ndarray, n: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``pagedkv_kept_start`` of each (kind, window, n), element by element, and where it
    is not NULL: the first position a group keeps of a request with n tokens (``window``
    read only where ``has_window``). tests/test_kv_groups.py holds the two equal."""
    import numpy as np

    sliding = np.array([k == SLIDING_WINDOW for k in kind], dtype=bool)
    chunked = np.array([k == CHUNKED_LOCAL for k in kind], dtype=bool)
    mamba = np.array([k == MAMBA for k in kind], dtype=bool)
    n = np.asarray(n, dtype=np.int64)
    safe = np.where(has_window, window, 1)
    start = np.zeros(n.size, dtype=np.int64)
    start = np.where(sliding, np.maximum(0, n - safe + 1), start)
    start = np.where(chunked, n // safe * safe, start)
    start = np.where(mamba, n, start)
    return start, ~((sliding | chunked) & ~np.asarray(has_window, dtype=bool))


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
    from .dbutil import scalar

    sql = "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'engine_kv_group'"
    return bool(scalar(con, sql))


def group_stats(con: duckdb.DuckDBPyConnection) -> tuple[GroupStats, ...]:
    """Every recorded group, in group order; none without an import that records them."""
    from .dbutil import run

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
    from .dbutil import run, scalar

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
    if kind and kind[0][0] == MAMBA:
        raise UsageError(
            f"KV-cache group {group} is a mamba group: its blocks hold each request's state, "
            "not tokens, so its tokens have no addresses",
            hint="`pagedkv-sql stats` lists the groups and their kinds",
        )
