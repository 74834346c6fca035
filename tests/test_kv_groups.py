"""KV-cache groups' one home (pagedkv_sql/kv_groups.py, sql/kv_groups.sql): the kept span's
SQL macro and its numpy twin agree on every kind and edge, replay's spelling of it agrees
with both, and the lists of kinds that SQL and the step log's JSON schema must spell out
are the module's."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from pagedkv_sql import kv_groups
from pagedkv_sql.replay.engine import sql as replay_sql
from pagedkv_sql.sqlfiles import sql_dir

ROOT = Path(__file__).resolve().parent.parent
KINDS = (None, *kv_groups.KINDS, "no_such_kind")
WINDOWS = (None, 1, 2, 3, 4, 7, 8, 64)
# n < W, n = W - 1, W, W + 1, chunk boundaries (multiples of every chunk above, +- 1)
COUNTS = tuple(sorted({0, 1, 2, 3, 5, 6, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000}))
CASES = list(itertools.product(KINDS, WINDOWS, COUNTS))


@pytest.fixture()
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(":memory:")
    kv_groups.create_macros(con)
    yield con
    con.close()


def _sql_starts(con: duckdb.DuckDBPyConnection) -> list[int | None]:
    con.execute("CREATE TABLE cases (i BIGINT, kind VARCHAR, w BIGINT, n BIGINT)")
    con.executemany("INSERT INTO cases VALUES (?, ?, ?, ?)", [(i, *c) for i, c in enumerate(CASES)])
    rows = con.execute("SELECT pagedkv_kept_start(kind, w, n) FROM cases ORDER BY i").fetchall()
    return [r[0] for r in rows]


def _twin_starts() -> list[int | None]:
    kind = [k for k, _, _ in CASES]
    window = np.array([w or 0 for _, w, _ in CASES], dtype=np.int64)
    has = np.array([w is not None for _, w, _ in CASES], dtype=bool)
    n = np.array([c for _, _, c in CASES], dtype=np.int64)
    start, known = kv_groups.kept_start(kind, window, has, n)
    return [int(s) if k else None for s, k in zip(start.tolist(), known.tolist(), strict=True)]


def test_the_kept_span_macro_and_its_numpy_twin_agree_on_every_kind_and_edge(
    con: duckdb.DuckDBPyConnection,
) -> None:
    assert _sql_starts(con) == _twin_starts()


def test_the_kept_span_is_what_each_kind_keeps(con: duckdb.DuckDBPyConnection) -> None:
    def start(kind: str | None, w: int | None, n: int) -> int | None:
        row = con.execute("SELECT pagedkv_kept_start(?, ?, ?)", [kind, w, n]).fetchone()
        assert row is not None
        return None if row[0] is None else int(row[0])

    assert start("full_attention", None, 10) == 0
    assert start(None, None, 10) == 0  # a group of no recorded kind keeps every token
    assert start("sliding_window", 4, 10) == 7  # the last W - 1 before the next
    assert start("sliding_window", 64, 10) == 0  # n < W: every token
    assert start("chunked_local_attention", 4, 8) == 8  # a chunk boundary: a new chunk
    assert start("chunked_local_attention", 4, 7) == 4
    assert start("mamba", None, 10) == 10  # no token: its blocks hold a state
    assert start("sliding_window", None, 10) is None  # a window's kind without its window
    assert start("chunked_local_attention", None, 10) is None


def test_replays_kept_span_is_the_one_macro_of_the_kind_its_window_names(
    con: duckdb.DuckDBPyConnection,
) -> None:
    con.execute(replay_sql("replay_key_macros"))
    for w, n in itertools.product(WINDOWS, COUNTS):
        sliding, chunked, full = (
            con.execute("SELECT replay_kept_from(?, ?, ?)", args).fetchall()[0][0]
            for args in ([n, w, None], [n, None, w], [n, None, None])
        )
        expect = con.execute(
            "SELECT pagedkv_kept_start('sliding_window', ?, ?), "
            "pagedkv_kept_start('chunked_local_attention', ?, ?)",
            [w, n, w, n],
        ).fetchall()[0]
        if w is None:
            assert (sliding, chunked) == (0, 0)
        else:
            assert (sliding, chunked) == expect
        assert full == 0


def test_the_kinds_sql_and_the_step_log_schema_spell_out_are_the_modules() -> None:
    engines = (sql_dir() / "engines.sql").read_text(encoding="utf-8")
    check = re.search(r"kind\s+VARCHAR CHECK \(kind IN \(([^)]*)\)\)", engines)
    assert check is not None
    assert tuple(re.findall(r"'(\w+)'", check.group(1))) == kv_groups.KINDS
    token_kinds = re.search(r"WHERE k\.kind IN \(([^)]*)\)", engines)
    assert token_kinds is not None
    assert tuple(re.findall(r"'(\w+)'", token_kinds.group(1))) == kv_groups.TOKEN_KINDS
    schema = json.loads((ROOT / "pagedkv_sql" / "replay" / "step-log.schema.json").read_text())
    assert tuple(schema["$defs"]["kv_group"]["properties"]["kind"]["enum"]) == kv_groups.KINDS


def test_every_windowed_kind_has_its_key_and_replay_checks_the_token_kinds() -> None:
    assert set(kv_groups.WINDOW_KEYS) <= set(kv_groups.TOKEN_KINDS) <= set(kv_groups.KINDS)
    assert kv_groups.REPLAYED_KINDS == kv_groups.TOKEN_KINDS
    assert kv_groups.MAMBA not in kv_groups.TOKEN_KINDS
    # a chain of events has gaps where blocks leave while the request runs
    assert set(kv_groups.WINDOW_KEYS) | {kv_groups.MAMBA} <= kv_groups.GAPPED_CHAINS
    assert kv_groups.FULL_ATTENTION not in kv_groups.GAPPED_CHAINS
