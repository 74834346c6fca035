"""A window free is judged at the tokens its request holds at that step, never at the count
the op carries: a count larger than the request's (an engine counting drafts or lookahead)
frees KV the window still reads, and replay and watch (which share the check) both find it,
naming both counts and only the tokens still read."""

from __future__ import annotations

import io
import json
from typing import Any

import duckdb
import pytest

import pagedkv_sql
from pagedkv_sql.live import steplog
from pagedkv_sql.live.steplog import StepLog

HEADER = {
    "pagedkv_step_log": 2,
    "block_size": 16,
    "num_gpu_blocks": 64,
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 32},
    ],
}
STEP0 = {
    "step": 0,
    "ops": [
        {"op": "allocate", "req": "a", "blocks": [1, 2], "group": 0},
        {"op": "allocate", "req": "a", "blocks": [3, 4], "group": 1},
        {"op": "append", "req": "a", "tokens": 20},
    ],
}


def _free(tokens: int, blocks: list[int]) -> dict[str, Any]:
    op = {"op": "window_free", "req": "a", "blocks": blocks, "tokens": tokens, "group": 1}
    return {"step": 1, "ops": [op]}


def _log(*steps: dict[str, Any]) -> list[bytes]:
    return [json.dumps(line).encode() for line in (HEADER, *steps)]


def replayed(lines: list[bytes]) -> list[tuple[str, int, int | None, str]]:
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(io.BytesIO(b"\n".join(lines) + b"\n"), keep_going=True)
    return sorted((f.check, f.step, f.block_id, f.message) for f in report.findings)


def watched(
    lines: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, int, int | None, str]]:
    monkeypatch.setattr(steplog, "WINDOW_LINES", 1)
    log = StepLog("log.jsonl")
    scratch = duckdb.connect(":memory:")
    for number, line in enumerate(lines, start=1):
        log.add(number, line)
    found = []
    while log.pending:
        found += log.check(scratch)
    return sorted((f.check, f.step, f.block_id, f.message) for f in found)


def test_an_inflated_count_frees_what_the_window_still_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """a holds 20 tokens, a window of 32 reads all of them: a free "at 100" of both
    window blocks is found in replay and in watch, the message naming both counts."""
    lines = _log(STEP0, _free(100, [3, 4]))
    found = replayed(lines)
    assert found == [
        (
            "unresolved_token",
            1,
            3,
            "request a released block 3 (its block 0) with tokens 0..15 in it that its window "
            "still reads (a window free at 100 token(s), but the request holds 20) in group 1",
        ),
        (
            "unresolved_token",
            1,
            4,
            "request a released block 4 (its block 1) with tokens 16..19 in it that its window "
            "still reads (a window free at 100 token(s), but the request holds 20) in group 1",
        ),
    ]
    assert watched(lines, monkeypatch) == found


def test_the_same_free_at_the_true_count_is_found_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _log(STEP0, _free(20, [3]))
    found = replayed(lines)
    assert [(c, s, b) for c, s, b, _ in found] == [("unresolved_token", 1, 3)]
    assert "(a window free at 20 token(s)) in group 1" in found[0][3]
    assert watched(lines, monkeypatch) == found


def test_an_inflated_count_that_frees_only_what_the_window_left_is_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 60 tokens the window keeps 29 on: block 0 (0..15) is out of it, whatever count
    the free says."""
    step1 = {
        "step": 1,
        "ops": [
            {"op": "allocate", "req": "a", "blocks": [5, 6], "group": 1},
            {"op": "allocate", "req": "a", "blocks": [7, 8], "group": 0},
            {"op": "append", "req": "a", "tokens": 40},
        ],
    }
    step2 = {**_free(1000, [3]), "step": 2}
    lines = _log(STEP0, step1, step2)
    assert replayed(lines) == []
    assert watched(lines, monkeypatch) == []


def test_an_early_free_names_only_the_tokens_still_read() -> None:
    """a holds 78 tokens; a window of 32 reads 47 on: of block 2 (32..47) one token."""
    step0 = {
        "step": 0,
        "ops": [
            {"op": "allocate", "req": "a", "blocks": [1, 2, 8, 9, 10], "group": 0},
            {"op": "allocate", "req": "a", "blocks": [3, 4, 5, 6, 7], "group": 1},
            {"op": "append", "req": "a", "tokens": 78},
        ],
    }
    found = replayed(_log(step0, _free(78, [3, 4, 5])))
    assert [(b, m) for _, _, b, m in found] == [
        (
            5,
            "request a released block 5 (its block 2) with tokens 47..47 in it that its window "
            "still reads (a window free at 78 token(s)) in group 1",
        )
    ]
