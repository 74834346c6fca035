"""The step log's sliding window (docs/replay.md, "KV-cache groups"): a placeholder
(``null`` in a block list) advances the index and holds no block; a ``window_free`` ends the
entries that left the window, their tokens no longer required; a window free of an entry
the window still needs, or a placeholder where it needs a block, is an unresolved_token
finding naming the request and block."""

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
            "request a released block 1 (its block 0) with tokens 0..15 in it",
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
