"""replay/engine.py and sql/replay.sql: the invariants a replay checks, each on its boundary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError

from .steplogs import alloc, append, findings, release, table


def test_a_block_released_unheld_in_the_step_that_frees_its_request_is_a_double_free() -> None:
    # a real bug: the check compared steps (`q.free_step > h.step`), so a double free
    # followed by the request's free in the same step went unseen
    steps = [
        {"step": 0, "ops": [alloc("a", 1), alloc("b", 2)]},
        {"step": 1, "ops": [release("a", 2), {"op": "free", "req": "a"}]},
    ]
    assert findings(steps) == [("double_free", 1, "release", "a", None)]


def test_a_release_after_the_free_of_its_step_names_a_freed_request_and_no_double_free() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1), alloc("b", 2)]},
        {"step": 1, "ops": [{"op": "free", "req": "a"}, release("a", 2)]},
    ]
    assert findings(steps) == [("freed_request_referenced", 1, "release", "a", None)]


def test_a_step_whose_first_event_repeats_the_last_event_of_the_step_before_is_out_of_order() -> (
    None
):
    rows = table([{"step": 0, "ops": [alloc("a", 1)]}, {"step": 1, "ops": [append("a", 2)]}])
    rows = rows.to_pylist()
    assert [(r["event"], r["step"]) for r in rows] == [(0, 0), (1, 0), (2, 1)]
    rows[2]["event"] = 1  # step 1 starts at the event step 0 ended with
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.replay(pa.Table.from_pylist(rows, schema=table([]).schema))
    assert e.value.details == [
        "event table: event 1: step 1 is out of order "
        "(its events from 1 come before event 1 of step 0)"
    ]


def test_a_block_handed_out_under_a_holder_names_the_holder_and_not_the_taker() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1), append("a", 2)]},
        # c writes tokens 4..5 (its block 1) before it has the block, then takes a's block 1
        {"step": 1, "ops": [alloc("c", 3), append("c", 6), alloc("c", 1)]},
    ]
    assert findings(steps) == [
        ("fresh_while_held", 1, "allocate", "c", "a"),
        ("stale_token", 1, "allocate", "a", "c"),  # a's tokens, in the block c now has
        ("stale_token", 1, "allocate", "c", None),  # c's tokens, written before its block
    ]


def test_an_append_after_the_release_of_its_block_in_the_same_step_is_unresolved() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1), append("a", 2)]},
        {"step": 1, "ops": [release("a", 1), append("a", 1)]},
    ]
    assert findings(steps) == [
        ("unresolved_token", 1, "release", "a", None),
        ("unresolved_token", 1, "append", "a", None),
    ]


@pytest.mark.parametrize("op", ["allocate", "share"])
def test_a_reserved_block_handed_out_by_allocate_or_share_is_outside_the_pool(op: str) -> None:
    steps = [{"step": 0, "ops": [{"op": op, "req": "a", "blocks": [0]}]}]
    assert findings(steps) == [("outside_pool", 0, op, "a", None)]


def test_a_fork_of_a_freed_parent_names_the_freed_parent() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1), append("a", 2)]},
        {"step": 1, "finished": ["a"], "ops": [{"op": "fork", "req": "b", "parent": "a"}]},
    ]
    assert findings(steps) == [("freed_request_referenced", 1, "fork", "a", "b")]


def test_loading_events_leaves_no_arrow_view_registered_on_the_connection() -> None:
    import duckdb

    from pagedkv_sql.replay import engine

    with pagedkv_sql.connect(":memory:") as db:
        engine.load_events(db.con, table([{"step": 0, "ops": [alloc("a", 1)]}]), validate=True)
        with pytest.raises(duckdb.CatalogException):
            db.con.sql("SELECT * FROM _pagedkv_events")


def test_a_swap_in_to_an_index_past_the_table_is_a_double_free_not_a_crash() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1)]},
        {"step": 1, "ops": [{"op": "swap_in", "req": "a", "blocks": [3], "indices": [5]}]},
    ]
    assert findings(steps) == [("double_free", 1, "swap_in", "a", None)]


def test_a_cpu_address_aligned_to_128_but_not_256_is_unaligned() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1)]},
        {"step": 1, "ops": [{"op": "swap_out", "req": "a", "blocks": [1], "cpu": [384]}]},
    ]
    assert findings(steps) == [("unaligned_cpu_address", 1, "swap_out", "a", None)]


def test_a_swap_out_of_all_blocks_skips_released_and_swapped_entries() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1, 2, 3), release("a", 1)]},  # index 0 released
        {"step": 1, "ops": [{"op": "swap_out", "req": "a", "blocks": [3], "cpu": [4096]}]},
        {"step": 2, "ops": [{"op": "swap_out", "req": "a", "cpu": [8192]}]},  # block 2 only
    ]
    rows = table(steps).to_pylist()
    assert [
        (r["block_index"], r["block_id"], r["cpu_address"]) for r in rows if r["step"] == 2
    ] == [(1, 2, 8192)]
    assert findings(steps) == []


def test_the_state_at_step_minus_1_is_refused_as_negative() -> None:
    from pagedkv_sql.errors import UsageError

    with pagedkv_sql.connect(":memory:") as db:
        db.replay(table([{"step": 0, "ops": [alloc("a", 1)]}]))
        with pytest.raises(UsageError, match="-1 is negative"):
            db.replay_at(-1)


V2 = {"pagedkv_step_log": 2, "block_size": 4, "num_gpu_blocks": 16, "reserved_blocks": [0]}


def first_and_all(steps: list[dict[str, Any]]) -> tuple[Any, list[tuple[Any, ...]]]:
    with pagedkv_sql.connect(":memory:") as db:
        first = db.replay(table(steps, V2)).first
        report = db.replay(keep_going=True)
    return first, [(f.check, f.step, f.request, f.block_id) for f in report.findings]


def test_a_free_that_keeps_a_held_block_back_is_a_leak_naming_request_and_block() -> None:
    # the tokens of the blocks the free gave back are not left unresolved: the request is
    # freed once, with what its free handed the pool
    steps = [
        {"step": 0, "ops": [alloc("a", 1, 2, 3), append("a", 10)]},
        {"step": 1, "ops": [{"op": "free", "req": "a", "handed": [3, 2]}]},
    ]
    first, found = first_and_all(steps)
    assert found == [("leak", 1, "a", 1)]
    assert first.block_index == 0 and "without giving it back" in first.message


def test_a_block_kept_back_that_another_request_still_holds_is_no_leak() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1, 2), {"op": "share", "req": "b", "blocks": [1]}]},
        {"step": 1, "ops": [{"op": "free", "req": "a", "handed": [2]}]},
    ]
    assert first_and_all(steps)[1] == []


def test_a_block_handed_twice_or_not_held_is_a_double_free_of_the_free() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1, 2), append("a", 5), alloc("b", 7)]},
        {"step": 1, "ops": [{"op": "preempt", "req": "a", "handed": [2, 1, 1, 7]}]},
    ]
    first, found = first_and_all(steps)
    assert found == [("double_free", 1, "a", 1), ("double_free", 1, "a", 7)]
    assert first.op == "preempt" and "given back twice, or was not its" in first.message


def test_a_database_of_an_older_version_replays_a_log_of_version_2(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with pagedkv_sql.connect(str(path)) as db:  # replay_op as an older version made it
        db.con.execute(
            "CREATE TYPE replay_op AS ENUM ('arrive', 'allocate', 'share', 'fork', 'swap_in', "
            "'append', 'swap_out', 'release', 'free', 'preempt', 'evict', 'observe_ref', "
            "'observe_free'); CREATE TABLE replay_event (op replay_op); "
            "CREATE TABLE replay_request (first_op replay_op)"
        )
    steps = [
        {"step": 0, "ops": [alloc("a", 1, 2), append("a", 8)]},
        {"step": 1, "ops": [{"op": "free", "req": "a", "handed": [2]}]},
    ]
    with pagedkv_sql.connect(str(path)) as db:
        assert [f.check for f in db.replay(table(steps, V2), keep_going=True).findings] == ["leak"]
