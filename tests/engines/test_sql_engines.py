"""The engine invariants (diag_engine_* views): each corruption the cited engine bugs
produced is found, and named by request id and block id."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import flashinfer
from pagedkv_sql.engines.tables import EngineState, Pool, table, write

from ..helpers import DATA, Cli
from .example import PATH as EXAMPLE
from .helpers import BLOCK, NUM_BLOCKS, SHARED, findings, spec_rows, state, with_group


def test_a_healthy_state_has_no_finding(db: pagedkv_sql.Database) -> None:
    assert findings(db, state(SHARED)) == {}
    refcounts = db.sql(
        "SELECT DISTINCT physical_block_base, refcount FROM block_table_entry"
    ).to_arrow_table()
    assert dict(zip(*[c.to_pylist() for c in refcounts.columns], strict=True))[256] == 2


def test_one_block_twice_in_one_list(db: pagedkv_sql.Database) -> None:
    # vLLM #42571: freeing the request frees block 3 twice
    found = findings(db, state({"req-a": [1, 2, 3, 3], "req-b": [1, 2, 5]}, {3: 1}))
    assert found["diag_engine_duplicate_block"] == ["request req-a lists block 3 2 times"]
    assert found["diag_engine_refcount_mismatch"] == [
        "ref_cnt 1 but 2 block-list entries hold block 3"
    ]


def test_block_held_while_in_the_free_queue(db: pagedkv_sql.Database) -> None:
    # vLLM #37076: a cached block with ref_cnt 0 evicted while a request still holds it
    found = findings(db, state(SHARED, {5: 0}, free=[5, 6, 7, 8, 9]))
    assert found["diag_engine_held_free_block"] == [
        "request req-b holds block 5, which is in the free queue at position 0"
    ]
    assert found["diag_engine_refcount_mismatch"] == [
        "ref_cnt 0 but 1 block-list entry hold block 5"
    ]


def test_free_queue_and_ref_cnt_disagree(db: pagedkv_sql.Database) -> None:
    found = findings(db, state(SHARED, free=[6, 7, 8, 3]))
    assert found["diag_engine_free_queue_ref_cnt"] == [
        "block 3 is in the free queue with ref_cnt 1",
        "block 9 has ref_cnt 0 but is not in the free queue",
    ]


def test_free_list_duplicate_and_outside_pool(db: pagedkv_sql.Database) -> None:
    found = findings(db, state({"req-a": [1, 12]}, {12: 1}, free=[2, 3, 4, 5, 6, 7, 8, 9, 9]))
    assert found["diag_engine_free_list_duplicate"] == ["block 9 is in the free queue 2 times"]
    assert found["diag_engine_outside_pool"] == [
        "block 12 is outside pool 0 (10 blocks) (request req-a)"
    ]


def test_a_renamed_check_is_still_a_view_under_its_old_name_and_runs_once(
    db: pagedkv_sql.Database,
) -> None:
    from pagedkv_sql.invariants import RENAMED_VIEWS

    found = findings(db, state({"req-a": [1, 12]}, {12: 1}, free=[2, 3, 4, 5, 6, 7, 8, 9, 9]))
    for old, new in RENAMED_VIEWS.items():
        rows = db.con.sql(f"SELECT * FROM {old} ORDER BY ALL").fetchall()
        assert rows == db.con.sql(f"SELECT * FROM {new} ORDER BY ALL").fetchall(), old
    assert db.con.sql("SELECT count(*) FROM diag_engine_slot_outside_pool").fetchall() == [(1,)]
    names = [r.name for r in db.check().results]
    assert "diag_engine_outside_pool" in names
    assert not set(RENAMED_VIEWS) & set(names)
    assert not set(RENAMED_VIEWS) & set(found)


def test_slot_at_the_wrong_place_of_its_page(db: pagedkv_sql.Database) -> None:
    slots = [BLOCK + i for i in range(BLOCK)]
    slots[3] = BLOCK + 4
    found = findings(db, state({"req-a": [1]}, slots={"req-a": slots}))
    assert found["diag_engine_slot_page_offset"] == [
        "token 3 of request req-a is in slot 20: slot % 16 = 4, pos % 16 = 3"
    ]


def test_check_and_explain_name_the_request(cli: object, tmp_path: object) -> None:
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb") as db:  # type: ignore[attr-defined]
        write(db.con, state({"req-a": [1, 2, 3, 3], "req-b": [1, 2, 5]}, {3: 1}), "t")
    r = cli("check")  # type: ignore[operator]
    assert r.exit_code == 0
    assert "duplicate_block (diag_engine_duplicate_block), warning, 1 row" in r.output
    assert "req-a" in r.output
    r = cli("explain", "1", "0")  # type: ignore[operator]
    assert "engine request     req-b" in r.output
    r = cli("check", "--strict")  # type: ignore[operator]
    assert r.exit_code == 1


def test_strict_import_refuses_and_keeps_the_old_state(db: pagedkv_sql.Database) -> None:
    write(db.con, state(SHARED), "good")
    with pytest.raises(pagedkv_sql.ConstraintError, match="refused under --strict"):
        write(db.con, state({"req-a": [1, 1]}, {1: 1}), "bad", strict=True)
    ids = (
        db.sql("SELECT request_id FROM engine_request ORDER BY 1")
        .to_arrow_table()
        .column(0)
        .to_pylist()
    )
    assert ids == ["req-a", "req-b"]


def test_a_plain_load_clears_the_engine_facts(db: pagedkv_sql.Database) -> None:
    write(db.con, state(SHARED), "good")
    db.load(DATA)
    assert db.sql("SELECT count(*) FROM engine_request").to_arrow_table().column(0).to_pylist() == [
        0
    ]


def test_an_empty_free_queue_still_shows_a_lost_block(db: pagedkv_sql.Database) -> None:
    found = findings(db, state({"req-a": [1, 2, 3, 4, 5, 6, 7, 8]}, free=[]))
    assert found["diag_engine_free_queue_ref_cnt"] == [
        "block 9 has ref_cnt 0 but is not in the free queue"
    ]


def test_invariant_views_read_like_relations(db: pagedkv_sql.Database) -> None:
    findings(db, state({"req-a": [1, 1]}, {1: 1}))
    table = db.reader("diag_engine_duplicate_block").read_all()
    assert table.column("request_id").to_pylist() == ["req-a"]


def test_a_negative_ref_cnt_breaks_the_spec_and_nothing_is_imported(
    db: pagedkv_sql.Database,
) -> None:
    write(db.con, state(SHARED), "good")
    with pytest.raises(pagedkv_sql.ConstraintError) as e:
        write(db.con, state(SHARED, {3: -1}), "bad")
    assert "1 row(s) of block_table_entry derived from bad violate" in e.value.message
    assert e.value.details == ["block_table_entry(0, 2, 768, -1): refcount -1 is negative"]
    assert db.sql("SELECT count(*) FROM block_table_entry").to_arrow_table().column(
        0
    ).to_pylist() == [7]


def test_a_free_counter_that_disagrees_with_the_free_queue(db: pagedkv_sql.Database) -> None:
    st = state(SHARED)
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS, free_count=5)]
    assert findings(db, st) == {
        "diag_engine_free_count": ["kv counts 5 free blocks, but its free queue holds 4"]
    }


CORE_CHECKS = [
    "spec_unaligned_base",
    "spec_offset_out_of_block",
    "spec_negative_refcount",
    "diag_refcount_mismatch",
    "diag_conflicting_location",
    "diag_conflicting_root",
    "diag_token_decomposition",
    "diag_unresolved_token",
    "diag_overlapping_blocks",
    "diag_unaligned_cpu_address",
    "diag_orphan_block_table",
    "diag_orphan_swapped_block",
]
ENGINE_CHECKS = [
    "diag_engine_prefix_hash",
    "diag_engine_csr_row",
    "diag_engine_disk_block",
    "diag_engine_duplicate_block",
    "diag_engine_free_count",
    "diag_engine_free_list_duplicate",
    "diag_engine_free_queue_ref_cnt",
    "diag_engine_unresolved_token",
    "diag_engine_held_free_block",
    "diag_engine_lock_ref",
    "diag_engine_leak",
    "diag_engine_refcount_mismatch",
    "diag_engine_outside_pool",
    "diag_engine_slot_page_offset",
    "diag_engine_tree_page_free",
]


def check_names(cli: Cli) -> tuple[list[str], list[str]]:
    """The checks `check` lists in its table, and those `check --format json` gives."""
    r = cli("check")
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    lines = r.output.splitlines()  # type: ignore[attr-defined]
    table = [line.split()[1] for line in lines[1 : lines.index("")]]  # invariant, check, ...
    r = cli("check", "--format", "json")
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    listed = [c["name"] for c in json.loads(r.output)["checks"]]  # type: ignore[attr-defined]
    assert table == listed, "the text and the JSON list the checks in one order"
    return sorted(table), sorted(listed)


def test_engine_checks_are_listed_only_while_engine_facts_are_there(cli: Cli) -> None:
    assert cli("import", "flashinfer", str(EXAMPLE)).exit_code == 0  # type: ignore[attr-defined]
    every = sorted(CORE_CHECKS + ENGINE_CHECKS)
    assert check_names(cli) == (every, every)
    assert cli("load", str(DATA), "--append").exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli)[0] == every  # the engine facts are kept
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli) == (sorted(CORE_CHECKS), sorted(CORE_CHECKS))
    r = cli("check")
    assert "diag_engine" not in r.output  # type: ignore[attr-defined]
    assert r.output.endswith(  # type: ignore[attr-defined]
        "unresolved_token (diag_unresolved_token), warning, 1 row:\n"
        "  seq_id  token_pos  block_index  offset_in_block  reason\n"
        "       2         16            1                0  block 1 of block table 101 is "
        "neither resident nor swapped\n\n0 error(s), 2 warning(s)\n"
    )
    # the views stay, readable by name (empty), and the next import runs them again
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb") as db:
        assert db.reader("diag_engine_csr_row").read_all().num_rows == 0
    assert cli("import", "flashinfer", str(EXAMPLE)).exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli)[1] == sorted(CORE_CHECKS + ENGINE_CHECKS)


def test_only_group_0_gives_block_table_entry_rows(db: pagedkv_sql.Database) -> None:
    # engine_to_block_table_entry's `bt.group_id = 0`: another KV-cache group's blocks
    # (vLLM's sliding-window group) stay in engine_block_table
    write(db.con, state(SHARED), "plain")
    plain = spec_rows(db, "block_table_entry")
    st = state(SHARED)
    with_group(st, [(0, 0, 6), (0, 1, 7), (1, 3, 8)])
    write(db.con, st, "two groups")
    assert spec_rows(db, "block_table_entry") == plain


def test_only_group_0_gives_swapped_block_rows(db: pagedkv_sql.Database) -> None:
    st = state(SHARED)
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS), Pool(1, "host", tier="cpu", num_blocks=4)]
    with_group(st, [(0, 4, 2)], pool=1)
    write(db.con, st, "a cpu block of group 1")
    assert spec_rows(db, "swapped_block") == []


def test_a_block_id_equal_to_the_pool_size_is_outside_it(db: pagedkv_sql.Database) -> None:
    # ids 0 .. NUM_BLOCKS - 1 are the pool's; NUM_BLOCKS itself is the first one outside
    found = findings(db, state({"req-a": [1, NUM_BLOCKS - 1, NUM_BLOCKS]}, {NUM_BLOCKS: 1}))
    assert found["diag_engine_outside_pool"] == [
        f"block {NUM_BLOCKS} is outside pool 0 ({NUM_BLOCKS} blocks) (request req-a)"
    ]


def two_pools(with_blocks: bool = True) -> EngineState:
    """Two GPU pools (TensorRT-LLM's primary pools of two window sizes, say) with the
    same block ids: req-a holds block 3 of pool 0, req-b and req-c block 3 of pool 1; block 5
    of pool 0 is free while req-b holds block 5 of pool 1."""
    blocks = None
    if with_blocks:
        blocks = table(
            "engine_block",
            pool_id=[0, 0, 0, 1, 1, 1],
            block_id=[3, 4, 5, 3, 4, 5],
            ref_cnt=[1, 0, 0, 2, 0, 1],
            is_null=[False] * 6,
        )
    return EngineState(
        engine="test",
        block_size=BLOCK,
        requests=table(
            "engine_request",
            seq_id=[0, 1, 2],
            request_id=["req-a", "req-b", "req-c"],
            num_tokens=[BLOCK, 2 * BLOCK, BLOCK],
        ),
        block_table=table(
            "engine_block_table",
            seq_id=[0, 1, 1, 2],
            group_id=[0, 0, 0, 0],
            block_index=[0, 0, 1, 0],
            pool_id=[0, 1, 1, 1],
            block_id=[3, 3, 5, 3],
        ),
        pools=[Pool(0, "primary", num_blocks=8), Pool(1, "primary-2", num_blocks=8)],
        blocks=blocks,
        free_blocks=table("engine_free_block", pool_id=[0, 0], position=[0, 1], block_id=[4, 5]),
    )


def test_refcounts_are_per_pool_when_the_engine_keeps_none(db: pagedkv_sql.Database) -> None:
    # the holders window partitions by (pool, block): block 3 of pool 0 has one holder
    write(db.con, two_pools(with_blocks=False), "no ref_cnt")
    rows = spec_rows(db, "block_table_entry")
    pool1 = 1 << 40
    assert rows == [
        (0, 0, 3 * 256, 1),
        (1, 0, pool1 + 3 * 256, 2),
        (1, 1, pool1 + 5 * 256, 1),
        (2, 0, pool1 + 3 * 256, 2),
    ]


def test_refcounts_come_from_the_block_of_the_same_pool(db: pagedkv_sql.Database) -> None:
    report = write(db.con, two_pools(), "ref_cnt per pool")
    assert [r.name for r in report.warnings] == ["diag_engine_free_queue_ref_cnt"]
    rows = spec_rows(db, "block_table_entry")
    assert [r[3] for r in rows] == [1, 2, 1, 2]


def test_a_free_block_of_another_pool_is_no_use_after_free(db: pagedkv_sql.Database) -> None:
    # ref_cnt matches the holders in each pool, and block 5 is free in pool 0 only: the only
    # finding is pool 1's block 4 (ref_cnt 0, not in the queue, which is pool 0's)
    found = findings(db, two_pools())
    assert found == {
        "diag_engine_free_queue_ref_cnt": ["block 4 has ref_cnt 0 but is not in the free queue"]
    }


def test_block_0_and_slot_0_are_inside_the_pool(db: pagedkv_sql.Database) -> None:
    # vLLM's sliding-window groups hold the null block 0; SGLang's slot 0 is a real slot
    found = findings(db, state({"req-a": [0, 1]}, slots={"req-a": list(range(BLOCK))}))
    assert "diag_engine_outside_pool" not in found
    # (a negative slot is refused by the SGLang import: sglang.to_state)
    found = findings(db, state({"req-a": [-1, 1]}, {-1: 1}))
    assert found["diag_engine_outside_pool"] == [
        "block -1 is outside pool 0 (10 blocks) (request req-a)"
    ]


def csr_findings(
    db: pagedkv_sql.Database, indptr: list[int], last: list[int], pages: int = 4
) -> list[str]:
    snap = flashinfer.snapshot(
        np.array(indptr, dtype=np.int32),
        np.arange(pages, dtype=np.int32),
        np.array(last, dtype=np.int32),
        BLOCK,
    )
    report = db.load_engine(snap)
    return [
        reason
        for r in report.warnings
        if r.name == "diag_engine_csr_row"
        for reason in r.rows.column("reason").to_pylist()
    ]


def test_last_page_lengths_1_and_the_page_size_are_fine(db: pagedkv_sql.Database) -> None:
    # a last page holds 1 .. page_size tokens; a sequence with no page (kv_indptr equal)
    # holds none, whatever its kv_last_page_len says
    assert csr_findings(db, [0, 1, 3, 3, 4], [1, BLOCK, 0, 5]) == []
    # the sequence with no page holds no block (and a backwards one none either)
    assert db.sql(
        "SELECT seq_id, count(*) FROM engine_block_table GROUP BY 1 ORDER BY 1"
    ).fetchall() == [
        (0, 1),
        (1, 2),
        (3, 1),
    ]
    assert csr_findings(db, [0, 1, 3, 3, 4], [0, BLOCK + 1, 0, 5]) == [
        "kv_last_page_len[0] = 0 is outside [1, 16]",
        f"kv_last_page_len[1] = {BLOCK + 1} is outside [1, 16]",
    ]


def test_a_ref_cnt_below_its_holders_is_a_mismatch(db: pagedkv_sql.Database) -> None:
    # block 1 is held twice with ref_cnt 1 (a double free waiting to happen), block 4 once
    # with ref_cnt 2 (a leak)
    found = findings(db, state(SHARED, {1: 1, 4: 2}))
    assert found["diag_engine_refcount_mismatch"] == [
        "ref_cnt 1 but 2 block-list entries hold block 1",
        "ref_cnt 2 but 1 block-list entry hold block 4",
    ]
