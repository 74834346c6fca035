"""What the map and the strips show (pagedkv_sql/report/data.py: the mismatch flag computed
from the bases' aggregates, the tokens read as 64-bit words, the strips put together in
numpy) is exactly what the plain queries of tests/plain_report.sql give, on random facts
with exact duplicate rows, shared and swapped blocks, orphans and out-of-range indexes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.report import data

from .helpers import arrow_table

PLAIN = Path(__file__).with_name("plain_report.sql").read_text()


def plain(name: str) -> str:
    parts = re.split(r"^-- name: (\w+)\n", PLAIN, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))[name].strip().rstrip(";")


def plain_strips(con: Any) -> dict[int, tuple[str, int]]:
    """The strips as first put together: one row per (seq_id, block_index) from SQL."""
    ids = [int(r[0]) for r in con.execute("SELECT DISTINCT seq_id FROM root_table").fetchall()]
    rows = con.execute(plain("report_logical_blocks"), [data.MAX_STRIP_BLOCKS - 1]).fetchall()
    strips: dict[int, dict[int, int]] = {i: {} for i in ids}
    tokens = dict.fromkeys(ids, 0)
    for seq, index, state, n in rows:
        strips[seq][index] = state
        tokens[seq] += n
    return {
        s: (
            "".join(data.STRIP_CODES[blocks.get(i, 0)] for i in range(max(blocks, default=-1) + 1)),
            tokens[s],
        )
        for s, blocks in strips.items()
    }


@pytest.fixture(scope="module")
def scratch() -> Iterator[Any]:
    with pagedkv_sql.connect(":memory:") as db:  # one for every example: a connect is slow
        yield db


ident = st.sampled_from([-1, 0, 1, 2, 2**62])
index = st.one_of(st.integers(0, 4), st.sampled_from([-1, 63, 64, 65535, 65536]))
facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(ident, ident), max_size=5),
        "block_table_entry": st.lists(
            st.tuples(ident, index, st.integers(0, 4).map(lambda k: k * 256), st.integers(0, 3)),
            max_size=12,
        ),
        "virtual_token": st.lists(
            st.tuples(ident, st.integers(0, 9), index, st.just(0)), max_size=14
        ),
        "swapped_block": st.lists(st.tuples(ident, index, st.integers(0, 9)), max_size=5),
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(facts, st.integers(0, 3))
def test_map_and_strips_match_the_plain_queries(
    scratch: Any, f: dict[str, list[tuple[int, ...]]], shell_duplicates: int
) -> None:
    db = scratch
    for relation, rows in f.items():
        db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
        db.sql(f"INSERT INTO {relation} SELECT * FROM {relation} LIMIT {shell_duplicates}")
    gpu, _ = data.tier_blocks(db.con)
    expected = db.con.sql(plain("report_gpu_blocks")).to_arrow_table()
    for column in expected.column_names:
        got = getattr(gpu, "holders" if column == "holders" else column)
        assert got.tolist() == np.asarray(expected.column(column)).tolist(), column
    mismatch = {
        r[0] for r in db.sql("SELECT physical_block_base FROM diag_refcount_mismatch").fetchall()
    }
    assert set(gpu.address[gpu.mismatch].tolist()) == mismatch
    strips = {s.seq_id: (s.strip, s.tokens) for s in data.sequences(db.con)}
    assert strips == plain_strips(db.con)


def test_what_the_pictures_show_of_the_spec_data(db: Any) -> None:
    """The data behind the map and the strips, which needs no plotting library."""
    from pagedkv_sql.report import data

    from .helpers import DATA

    db.load(DATA)
    gpu, cpu = data.tier_blocks(db.con)
    assert gpu.address.tolist() == [0x10000000, 0x20000000, 0x30000000, 0x40000000]
    assert gpu.seq_id.tolist() == [1, 1, 2, 2]
    assert gpu.mismatch.tolist() == [True, False, False, False]
    assert gpu.holders.tolist() == [1, 1, 1, 1] and gpu.refcount.tolist() == [2, 1, 1, 1]
    assert cpu.address.tolist() == [0x70000000] and cpu.seq_id.tolist() == [1]
    # seq 1: block 0 in the mismatched base, 1 resident, 2 swapped; seq 2: 0 resident,
    # 1 missing (token 16 needs it), 2 resident
    strips = {s.seq_id: (s.strip, s.tokens, s.block_tables) for s in data.sequences(db.con)}
    assert strips == {1: ("xrc", 5, "100"), 2: ("rmr", 3, "101")}
    assert data.request_ids(db.con) == {}


def test_a_duplicate_row_is_one_holder_and_an_orphan_is_leaked(db: Any) -> None:
    from pagedkv_sql.report import data

    from .helpers import DATA

    db.load(DATA)
    # what a DuckDB shell can do: an exact duplicate row, a table no sequence points to
    db.con.execute("INSERT INTO block_table_entry VALUES (100, 1, 536870912, 1)")
    db.con.execute("INSERT INTO block_table_entry VALUES (555, 0, 1280, 1)")
    gpu, _ = data.tier_blocks(db.con)
    assert gpu.address.tolist()[0] == 1280
    assert gpu.orphan.tolist() == [True, False, False, False, False]
    assert gpu.holders.tolist() == [1, 1, 1, 1, 1]
    assert gpu.seq_id.tolist()[0] == -1
    strips = {s.seq_id: s.strip for s in data.sequences(db.con)}
    assert strips == {1: "xrc", 2: "rmr"}  # the duplicate does not make block 1 shared


def test_the_map_holds_every_kv_cache_group_s_blocks_with_its_group(
    db: pagedkv_sql.Database,
) -> None:
    """A hybrid model's groups share one pool: the map shows the sliding-window group's
    blocks beside the spec's (the full group's), each cell naming its group; a block of a
    group whose ref_cnt is off is a mismatch."""
    from pagedkv_sql.report import grid

    from .engines.helpers import grouped_snapshot

    window = {"kind": "sliding_window", "block_size": 4, "sliding_window": 8}
    full = {"kind": "full_attention", "block_size": 4}
    lists = {"r1": [[0, 7, 5, 6], [1, 2, 3, 4]], "r2": [[0, 0, 8, 9, 10], [1, 2, 12, 13, 14]]}
    db.load_engine(grouped_snapshot([window, full], lists, {"r1": 13, "r2": 17}))
    with db.cursor() as cur:
        gpu, _, _ = data.tiers_and_slots(cur)
    assert gpu.group is not None
    by_block = dict(zip((gpu.address // 256).tolist(), gpu.group.tolist(), strict=True))
    assert by_block == {1: 1, 2: 1, 3: 1, 4: 1, 12: 1, 13: 1, 14: 1} | {
        b: 0 for b in (5, 6, 7, 8, 9, 10)
    }
    assert not gpu.mismatch.any()
    m = grid.layout(gpu, data.tier_blocks(db.con)[1])
    t = m.tier("gpu")
    assert grid.tier_title(t).endswith("; blocks of KV-cache group 0: 6, 1: 7")
    assert grid.cell_text(t, t.cell_of(7 * 256), m.palette) == "seq 0\ngroup 0"
    assert grid.cell_text(t, t.cell_of(1 * 256), m.palette) == "shared\nrefcount 2\ngroup 1"
    db.sql("UPDATE engine_block SET ref_cnt = 3 WHERE block_id = 9")
    with db.cursor() as cur:
        gpu, _, _ = data.tiers_and_slots(cur)
    assert (gpu.address[gpu.mismatch] // 256).tolist() == [9]


def test_a_window_s_dropped_entries_are_not_drawn_missing(db: pagedkv_sql.Database) -> None:
    """An all-sliding model: the entries that left the window hold the null block; their
    tokens are no token of the cache, so the strip shows no block there, not a missing
    one."""
    from .engines.helpers import grouped_snapshot

    window = {"kind": "sliding_window", "block_size": 4, "sliding_window": 8}
    lists = {"r1": [[0, 7, 5, 6]], "r2": [[0, 0, 8, 9, 10]]}
    db.load_engine(grouped_snapshot([window], lists, {"r1": 13, "r2": 17}))
    with db.cursor() as cur:
        strips = [(s.strip, s.tokens) for s in data.sequences(cur)]
    assert strips == [(".rrr", 7), ("..rrr", 7)]
    db.sql("UPDATE engine_kv_group SET kind = 'full_attention'")  # as if every token were kept
    db.sql("DELETE FROM virtual_token")
    db.sql(
        "INSERT INTO virtual_token SELECT seq_id, p, p // 4, p % 4 FROM engine_request, "
        "range(num_tokens) t(p)"
    )
    with db.cursor() as cur:
        assert [s.strip for s in data.sequences(cur)] == ["mrrr", "mmrrr"]


def test_the_timeline_counts_each_request_once_whatever_its_groups(tmp_path: Path) -> None:
    """A log of two KV-cache groups has a row per request and group: the requests alive
    are 1, 2, 2, 1 at steps 0..3, not twice that; the GPU blocks are each group's."""
    import json

    header = {
        "pagedkv_step_log": 2,
        "engine": "vllm",
        "block_size": 16,
        "num_gpu_blocks": 64,
        "reserved_blocks": [0],
        "groups": [
            {"kind": "sliding_window", "block_size": 32, "sliding_window": 64},
            {"kind": "full_attention", "block_size": 16},
        ],
    }

    def alloc(req: str, blocks: list[int], group: int) -> dict[str, Any]:
        return {"op": "allocate", "req": req, "blocks": blocks, "group": group}

    steps = [
        {
            "step": 0,
            "ops": [
                alloc("a", [1, 2, 3], 1),
                alloc("a", [10, 11], 0),
                {"op": "append", "req": "a", "tokens": 40},
            ],
        },
        {
            "step": 1,
            "ops": [
                alloc("b", [20], 1),
                alloc("b", [21], 0),
                {"op": "append", "req": "b", "tokens": 10},
            ],
        },
        {"step": 2, "ops": [alloc("a", [4], 1)]},
        {"step": 3, "ops": [{"op": "free", "req": "b"}]},
    ]
    log = tmp_path / "two.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in [header, *steps]))
    with pagedkv_sql.connect(":memory:") as db:
        db.replay(log)
        series = data.timeline(db.con)
    assert series is not None
    assert series.series["requests alive"].tolist() == [1, 2, 2, 1]
    assert series.series["gpu blocks"].tolist() == [5, 7, 8, 6]
