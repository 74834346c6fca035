"""The engine invariants (diag_engine_* views): each corruption the cited engine bugs
produced is found, and named by request id and block id."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines.tables import EngineState, Pool, table, write

from ..conftest import DATA, Cli
from .example import PATH as EXAMPLE

BLOCK = 16
NUM_BLOCKS = 10


def state(
    lists: dict[str, list[int]],
    ref_cnt: dict[int, int] | None = None,
    free: list[int] | None = None,
    slots: dict[str, list[int]] | None = None,
) -> EngineState:
    """A vLLM-like state: requests with block lists, every block's ref_cnt (default: its
    holders), the free queue (default: the blocks nobody holds), null block 0."""
    ids = list(lists)
    holders: dict[int, int] = {}
    for blocks in lists.values():
        for b in blocks:
            holders[b] = holders.get(b, 0) + 1
    counts = {b: holders.get(b, 0) for b in range(1, NUM_BLOCKS)}
    counts.update(ref_cnt or {})
    queue = free if free is not None else [b for b in range(1, NUM_BLOCKS) if not holders.get(b)]
    seq = [i for i, r in enumerate(ids) for _ in lists[r]]
    idx = [j for r in ids for j in range(len(lists[r]))]
    block_ids = [b for r in ids for b in lists[r]]
    token_slots = None
    if slots:
        rows = [(ids.index(r), pos, s) for r, ss in slots.items() for pos, s in enumerate(ss)]
        token_slots = table(
            "engine_token_slot",
            seq_id=[r[0] for r in rows],
            token_pos=[r[1] for r in rows],
            slot=[r[2] for r in rows],
        )
    return EngineState(
        engine="test",
        block_size=BLOCK,
        requests=table(
            "engine_request",
            seq_id=np.arange(len(ids)),
            request_id=ids,
            num_tokens=[len(lists[r]) * BLOCK for r in ids],
        ),
        block_table=table(
            "engine_block_table",
            seq_id=seq,
            group_id=[0] * len(seq),
            block_index=idx,
            pool_id=[0] * len(seq),
            block_id=block_ids,
        ),
        pools=[Pool(0, "kv", num_blocks=NUM_BLOCKS)],
        blocks=table(
            "engine_block",
            pool_id=[0] * NUM_BLOCKS,
            block_id=list(range(NUM_BLOCKS)),
            ref_cnt=[0, *(counts[b] for b in range(1, NUM_BLOCKS))],
            is_null=[True] + [False] * (NUM_BLOCKS - 1),
        ),
        free_blocks=table(
            "engine_free_block",
            pool_id=[0] * len(queue),
            position=list(range(len(queue))),
            block_id=queue,
        ),
        token_slots=token_slots,
    )


def findings(db: pagedkv_sql.Database, st: EngineState) -> dict[str, list[str]]:
    report = write(db.con, st, "test")
    return {r.name: sorted(r.rows.column("reason").to_pylist()) for r in report.warnings}


SHARED = {"req-a": [1, 2, 3, 4], "req-b": [1, 2, 5]}


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
    assert found["diag_engine_ref_cnt_mismatch"] == [
        "ref_cnt 1 but 2 block-list entries hold block 3"
    ]


def test_block_held_while_in_the_free_queue(db: pagedkv_sql.Database) -> None:
    # vLLM #37076: a cached block with ref_cnt 0 evicted while a request still holds it
    found = findings(db, state(SHARED, {5: 0}, free=[5, 6, 7, 8, 9]))
    assert found["diag_engine_held_free_block"] == [
        "request req-b holds block 5, which is in the free queue at position 0"
    ]
    assert found["diag_engine_ref_cnt_mismatch"] == [
        "ref_cnt 0 but 1 block-list entry hold block 5"
    ]


def test_free_queue_and_ref_cnt_disagree(db: pagedkv_sql.Database) -> None:
    found = findings(db, state(SHARED, free=[6, 7, 8, 3]))
    assert found["diag_engine_free_queue_ref_cnt"] == [
        "block 3 is in the free queue with ref_cnt 1",
        "block 9 has ref_cnt 0 but is not in the free queue",
    ]


def test_free_queue_duplicate_and_slot_outside_pool(db: pagedkv_sql.Database) -> None:
    found = findings(db, state({"req-a": [1, 12]}, {12: 1}, free=[2, 3, 4, 5, 6, 7, 8, 9, 9]))
    assert found["diag_engine_free_queue_duplicate"] == ["block 9 is in the free queue 2 times"]
    assert found["diag_engine_slot_outside_pool"] == [
        "block 12 is outside pool 0 (10 blocks) (request req-a)"
    ]


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
    assert "diag_engine_duplicate_block (warning, 1 row)" in r.output
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
    "diag_engine_csr_row",
    "diag_engine_disk_block",
    "diag_engine_duplicate_block",
    "diag_engine_free_count",
    "diag_engine_free_queue_duplicate",
    "diag_engine_free_queue_ref_cnt",
    "diag_engine_held_free_block",
    "diag_engine_ref_cnt_mismatch",
    "diag_engine_slot_outside_pool",
    "diag_engine_slot_page_offset",
]


def check_names(cli: Cli) -> tuple[list[str], list[str]]:
    """The checks `check` lists in its table, and those `check --format json` gives."""
    r = cli("check")
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    lines = r.output.splitlines()  # type: ignore[attr-defined]
    table = [line.split()[0] for line in lines[1 : lines.index("")]]
    r = cli("check", "--format", "json")
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    return table, [c["name"] for c in json.loads(r.output)["checks"]]  # type: ignore[attr-defined]


def test_engine_checks_are_listed_only_while_engine_facts_are_there(cli: Cli) -> None:
    assert cli("import", "flashinfer", str(EXAMPLE)).exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli) == (CORE_CHECKS + ENGINE_CHECKS, CORE_CHECKS + ENGINE_CHECKS)
    assert cli("load", str(DATA), "--append").exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli)[0] == CORE_CHECKS + ENGINE_CHECKS  # the engine facts are kept
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli) == (CORE_CHECKS, CORE_CHECKS)
    r = cli("check")
    assert "diag_engine" not in r.output  # type: ignore[attr-defined]
    assert r.output.endswith(  # type: ignore[attr-defined]
        "diag_unresolved_token (warning, 1 row):\n"
        "  seq_id  token_pos  block_index  offset_in_block  reason\n"
        "       2         16            1                0  block 1 of block table 101 is "
        "neither resident nor swapped\n\n0 error(s), 2 warning(s)\n"
    )
    # the views stay, readable by name (empty), and the next import runs them again
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb") as db:
        assert db.reader("diag_engine_csr_row").read_all().num_rows == 0
    assert cli("import", "flashinfer", str(EXAMPLE)).exit_code == 0  # type: ignore[attr-defined]
    assert check_names(cli)[1] == CORE_CHECKS + ENGINE_CHECKS
