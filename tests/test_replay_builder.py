"""The step log's KV-cache groups (docs/replay.md, "KV-cache groups"): a placeholder
(``null`` in a block list) advances the index and holds no block; a ``window_free`` ends the
entries that left the window, their tokens no longer required; a window free of an entry
the window still needs, or a placeholder where it needs a block, is an unresolved_token
finding naming the request and block. In a log of several groups each op names its group:
each group's table is checked with its window, ownership over the shared pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import log as steplog

from .steplogs import WINDOW_HEADER, alloc_slots, window_log, write_log


def replay(tmp_path: Path, steps: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    log = write_log(tmp_path / "swa.jsonl", steps, WINDOW_HEADER)
    with pagedkv_sql.connect(":memory:") as db:
        found = db.replay(log, keep_going=True).findings
        again = db.replay(keep_going=True).findings  # the stored log, its window kept
    assert again == found
    return [(f.check, f.step, f.message) for f in found]


def test_a_placeholder_advances_the_index_and_holds_no_block() -> None:
    lines = [
        json.dumps(WINDOW_HEADER),
        json.dumps({"step": 1, "ops": [alloc_slots("c", [None, 2, None, 4])]}),
    ]
    rows = steplog.read_jsonl(lines, "<test>").to_pylist()
    assert [(r["op"], r["block_index"], r["block_id"]) for r in rows] == [
        ("arrive", None, None),
        ("allocate", 1, 2),
        ("allocate", 3, 4),
    ]


def test_a_window_free_is_a_release_at_the_tokens_it_was_measured_at() -> None:
    lines = [json.dumps(WINDOW_HEADER), *(json.dumps(s) for s in window_log()[:2])]
    rows = steplog.read_jsonl(lines, "<test>").to_pylist()
    released = [(r["block_index"], r["block_id"], r["value"]) for r in rows if r["op"] == "release"]
    assert released == [(0, 1, 49)]


def test_a_window_free_needs_a_sliding_window_group(tmp_path: Path) -> None:
    header = {k: v for k, v in WINDOW_HEADER.items() if k != "groups"}
    log = write_log(tmp_path / "full.jsonl", window_log(), header)
    with pytest.raises(InputError) as e:
        steplog.read_log(log)
    assert e.value.details[0].startswith(f"{log}:3: ops[0] (window_free)")
    assert (
        "a window_free needs a sliding_window or chunked_local_attention group"
        in (e.value.details[0])
    )


def test_a_healthy_window_is_silent(tmp_path: Path) -> None:
    assert replay(tmp_path, window_log()) == []


def test_a_window_free_the_window_still_needs_is_found(tmp_path: Path) -> None:
    """At 40 processed tokens the window keeps positions 9 on: block 0 still holds 9..15."""
    assert replay(tmp_path, window_log(freed_at=40)) == [
        (
            "unresolved_token",
            2,
            "request a released block 1 (its block 0) with tokens 9..15 in it that its window "
            "still reads (a window free at 40 token(s))",
        )
    ]


def test_a_placeholder_inside_the_window_is_found(tmp_path: Path) -> None:
    """A hit of 41 tokens keeps positions 10 on: its placeholder at block 0 is a hole."""
    found = replay(tmp_path, window_log(hit=41))
    assert found == [("unresolved_token", 3, "tokens 0..15 of request c have no block 0")]


def test_a_log_without_its_window_frees_is_not_silent(tmp_path: Path) -> None:
    """The window free is what ends a's hold: without it, b's block is still a's."""
    steps = window_log()
    steps[1]["ops"] = steps[1]["ops"][1:]
    checks = {c for c, _, _ in replay(tmp_path, steps)}
    assert {"fresh_while_held", "stale_token"} <= checks


def test_the_state_at_a_step_has_the_tokens_the_window_keeps(tmp_path: Path) -> None:
    """At step 3 a holds 49 tokens (positions 18 on kept), b 4, c 50 (19 on): the spec's
    tables have those, each with its block, and check finds nothing."""
    log = write_log(tmp_path / "swa.jsonl", window_log(), WINDOW_HEADER)
    with pagedkv_sql.connect(tmp_path / "kv.duckdb") as db:
        db.replay(log)
        db.replay_at(3)
        kept = db.sql("SELECT seq_id, min(token_pos), count(*) FROM virtual_token GROUP BY 1")
        assert sorted(kept.fetchall()) == [(1, 18, 31), (2, 0, 4), (3, 19, 31)]
        report = db.check()
        assert (report.errors, report.warnings) == (0, 0)


# -- several KV-cache groups: group 0 full attention, group 1 the sliding window above ------
HYBRID_HEADER = {
    **WINDOW_HEADER,
    "groups": [{"kind": "full_attention", "block_size": 16}, *WINDOW_HEADER["groups"]],
}
FULL_BLOCKS = {"a": [11, 12, 13, 14], "b": [15], "c": [11, 12, 13, 14]}


def hybrid_log(**kw: Any) -> list[dict[str, Any]]:
    """window_log's steps in group 1, each request's full-attention table in group 0 (c's
    hit shares a's four blocks there: 64 tokens in both groups)."""
    steps = json.loads(json.dumps(window_log(**kw)))
    for step in steps:
        ops = []
        for op in step["ops"]:
            if op["op"] in ("allocate", "share", "window_free"):
                if op["op"] != "window_free":
                    ops.append({**op, "blocks": FULL_BLOCKS[op["req"]]})
                op = {**op, "group": 1}
            ops.append(op)
        step["ops"] = ops
    return steps


def replay_hybrid(tmp_path: Path, steps: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    log = write_log(tmp_path / "hybrid.jsonl", steps, HYBRID_HEADER)
    with pagedkv_sql.connect(":memory:") as db:
        return [(f.check, f.step, f.message) for f in db.replay(log, keep_going=True).findings]


def test_a_healthy_hybrid_log_is_silent(tmp_path: Path) -> None:
    assert replay_hybrid(tmp_path, hybrid_log()) == []


def test_a_window_free_inside_group_1_s_window_is_found_naming_the_group(tmp_path: Path) -> None:
    found = replay_hybrid(tmp_path, hybrid_log(freed_at=20, block=2))
    unresolved = [f for f in found if f[:2] == ("unresolved_token", 2)]
    assert unresolved and unresolved[0][2].endswith(" in group 1"), found


def test_a_block_in_two_groups_tables_at_once_is_held_twice(tmp_path: Path) -> None:
    steps = hybrid_log()
    steps[0]["ops"].insert(1, {"op": "allocate", "req": "d", "group": 1, "blocks": [11]})
    found = replay_hybrid(tmp_path, steps)
    assert found and found[0][:2] == ("fresh_while_held", 1), found


def test_an_op_of_a_group_the_header_lacks_is_an_error_of_its_line(tmp_path: Path) -> None:
    steps = hybrid_log()
    steps[0]["ops"][0]["group"] = 2
    with pytest.raises(InputError) as e:
        steplog.read_log(write_log(tmp_path / "bad.jsonl", steps, HYBRID_HEADER))
    assert "ops[0] (allocate).group 2 is not a KV-cache group of the log" in e.value.details[0]


def test_vllm_s_tuple_of_one_list_a_group_is_read_per_group() -> None:
    lines = [
        json.dumps(HYBRID_HEADER),
        json.dumps(
            {"step": 0, "new_requests": [{"req_id": "a", "block_ids": [[5, 6], [None, 7]]}]}
        ),
    ]
    rows = steplog.read_jsonl(lines, "<test>").to_pylist()
    held = [(r["group_id"], r["block_index"], r["block_id"]) for r in rows if r["block_id"]]
    assert held == [(0, 0, 5), (0, 1, 6), (1, 1, 7)]


def test_an_event_table_written_before_group_id_reads_as_group_0(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    log = write_log(tmp_path / "swa.jsonl", window_log(), WINDOW_HEADER)
    table = steplog.read_log(log)
    old = tmp_path / "old.parquet"
    pq.write_table(table.drop_columns(["group_id"]), old)
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(old, keep_going=True).findings == []
        assert db.sql("SELECT DISTINCT group_id FROM replay_event").fetchall() == [(0,)]
