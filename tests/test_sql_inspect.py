"""`stats` (sql/inspect.sql, sets kept as 64-bit word bitmaps) gives exactly the figures of
the plain definitions in tests/plain_stats.sql (DISTINCT, EXCEPT, INTERSECT), on random
facts whose values sit on the words' edges and the int64 limits, with exact duplicate rows
inserted from SQL and from the DuckDB shell itself."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.engines import flashinfer

from .engines.helpers import sglang_snapshot, vllm_snapshot
from .engines.snapshots import csr_arrays
from .helpers import DATA, DUCKDB_SHELL, arrow_table

PLAIN = Path(__file__).with_name("plain_stats.sql").read_text()
TOP, BOTTOM = 2**63 - 1, -(2**63)


def plain(name: str, block_size: int) -> str:
    parts = re.split(r"^-- name: (\w+)\n", PLAIN, flags=re.M)
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    return found[name].strip().rstrip(";").replace("$block_size", str(block_size))


def plain_stats(db: Any, block_size: int) -> tuple[dict[str, int], list[tuple[int, int]]]:
    cursor = db.con.execute(plain("stats", block_size))
    names = [d[0] for d in cursor.description]
    counts = {n: int(v) for n, v in zip(names, cursor.fetchall()[0], strict=True)}
    rows = db.con.execute(plain("refcount_histogram", 1)).fetchall()
    histogram = [(int(a), int(b)) for a, b in rows]
    return counts, histogram


# Ids from a few values, so that sequences, block tables and tiers meet; indexes and
# positions on both sides of the 64-bit words' edges (x >> 6), negative, and the limits.
ident = st.sampled_from([BOTTOM, -1, 0, 1, TOP])
EDGES = [BOTTOM, BOTTOM + 63, BOTTOM + 64, -65, -64, -1, 63, 64, 127, 128, 2**62, TOP - 64, TOP]
key = st.one_of(st.integers(0, 3), st.sampled_from(EDGES))
# 256-aligned bases on the edges of base >> 14 words, and of the int64 range
base = st.one_of(
    st.sampled_from([BOTTOM, -(2**14), -256, 2**14 - 256, 2**14, 2**14 + 256, TOP - 255]),
    st.integers(0, 6).map(lambda k: k * 256),
)
cpu = st.one_of(base, st.sampled_from([1, 255, 2**14 + 1, TOP, BOTTOM + 1]))
facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(ident, ident), max_size=6),
        "block_table_entry": st.lists(st.tuples(ident, key, base, st.integers(0, 3)), max_size=12),
        "virtual_token": st.lists(
            st.tuples(ident, key, key, st.sampled_from([0, 1, 255])), max_size=16
        ),
        "swapped_block": st.lists(st.tuples(ident, key, cpu), max_size=8),
    }
)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Any]:
    with pagedkv_sql.connect(":memory:") as db:  # one for every example: a connect is slow
        yield db


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(facts, st.sampled_from([1, 3, 16, 256]), st.integers(0, 3))
def test_stats_match_the_plain_definitions(
    scratch: Any, f: dict[str, list[tuple[int, ...]]], block_size: int, shell_duplicates: int
) -> None:
    db = scratch
    for relation, rows in f.items():
        db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
        db.sql(f"INSERT INTO {relation} SELECT * FROM {relation} LIMIT {shell_duplicates}")
    s = db.stats(block_size)
    assert (s.counts, s.refcount_histogram) == plain_stats(db, block_size)


def test_stats_of_a_dense_cache_match_the_plain_definitions() -> None:
    """Thousands of tokens and blocks, so that words hold many bits, shared and swapped
    blocks among them, and every row twice."""
    from pagedkv_sql.synth import SynthConfig, synthesize

    tables = synthesize(SynthConfig(sequences=40, mean_length=300, missing_fraction=0.05, seed=3))
    with pagedkv_sql.connect(":memory:") as db:
        for relation, table in tables.items():
            db.load_arrow(relation, table, diagnostics=False)
        before = db.stats()
        assert before.counts["tokens"] == tables["virtual_token"].num_rows > 5000
        assert (before.counts, before.refcount_histogram) == plain_stats(db, 16)
        for relation in tables:
            db.sql(f"INSERT INTO {relation} SELECT * FROM {relation}")
        after = db.stats()
        assert (after.counts, after.refcount_histogram) == (
            before.counts,
            before.refcount_histogram,
        )


@pytest.mark.skipif(DUCKDB_SHELL is None, reason="duckdb-cli is not installed")
def test_rows_inserted_twice_from_the_duckdb_shell_are_one_fact(tmp_path: Path) -> None:
    path = tmp_path / "pagedkv.duckdb"
    with pagedkv_sql.connect(path) as db:
        db.load(DATA)
        before = db.stats()
    assert DUCKDB_SHELL is not None
    inserts = "".join(
        f"INSERT INTO {r} SELECT * FROM {r};"
        for r in ("root_table", "block_table_entry", "virtual_token", "swapped_block")
    )
    shell = subprocess.run(
        [DUCKDB_SHELL, str(path), "-c", inserts + "SELECT count(*) FROM virtual_token"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shell.returncode == 0, shell.stderr
    with pagedkv_sql.connect(path, read_only=True) as db:
        rows = db.con.execute("SELECT count(*) FROM virtual_token").fetchone()
        assert rows is not None and rows[0] == 2 * before.counts["tokens"]
        after = db.stats()
        assert (after.counts, after.refcount_histogram) == (
            before.counts,
            before.refcount_histogram,
        )
        assert (after.counts, after.refcount_histogram) == plain_stats(db, 16)


# -- pool_stats: each engine pool's blocks after an import ----------------------------------


def pools(db: pagedkv_sql.Database) -> list[tuple[Any, ...]]:
    return [
        (p.blocks, p.held, p.cached, p.free, p.reserved, p.unaccounted) for p in db.stats().pools
    ]


def test_vllm_pool_blocks_are_held_cached_free_or_the_null_block(
    db: pagedkv_sql.Database,
) -> None:
    snap = vllm_snapshot()  # blocks 1..5 held, 6 and 7 in the free queue, 0 the null block
    snap.meta["block_hashes"] = {"6": "ab12", "3": "cd34"}  # 6: a cached prefix nobody holds
    db.load_engine(snap)
    assert pools(db) == [(8, 5, 1, 1, 1, 0)]
    # a block nobody holds and the free queue lost: unaccounted (as diag_engine_free_count)
    snap.arrays["free_block_queue"] = np.array([6], np.int32)
    snap.meta["num_free_blocks"] = 1
    db.load_engine(snap)
    assert pools(db) == [(8, 5, 1, 0, 1, 1)]


def test_sglang_unlocked_tree_pages_are_cached_and_a_lost_page_unaccounted(
    db: pagedkv_sql.Database,
) -> None:
    snap = sglang_snapshot()  # rows hold pages 1..4 (1, 2 locked tree pages), 5..7 free
    snap.arrays["tree_pages"] = np.array([1, 2, 6], np.int64)
    snap.arrays["tree_lock_ref"] = np.array([2, 2, 0], np.int64)
    snap.arrays["free_pages"] = np.array([5], np.int64)  # page 7 is lost
    db.load_engine(snap)
    assert pools(db) == [(8, 4, 1, 1, 1, 1)]
    # without the tree, a cached page cannot be told from a lost one: not counted
    for name in ("tree_pages", "tree_lock_ref"):
        del snap.arrays[name]
    db.load_engine(snap)
    assert pools(db) == [(8, 4, 0, 1, 1, None)]


def test_a_pool_without_a_free_list_says_so_and_a_plain_load_has_no_pool(
    db: pagedkv_sql.Database,
) -> None:
    assert db.stats().pools == ()
    indptr, indices, last = csr_arrays()
    cache = np.zeros((9, 2, 16, 1, 8), np.float16)
    db.load_engine(flashinfer.snapshot(indptr, indices, last, 16, paged_kv_cache=cache))
    (pool,) = db.stats().pools
    assert (pool.name, pool.tier) == ("paged_kv_cache", "gpu")
    assert pools(db) == [(9, 3, 0, None, 0, None)]
    db.load(DATA)  # a replacing load: the engine tables described the state it replaced
    assert db.stats().pools == ()
