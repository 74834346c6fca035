"""A block handed out fresh while another request holds it is named with the op and
request that let it go while it was still held (the culprit first, the victims after),
in replay and in watch, whether the let-go was in the window checked or windows before."""

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


def _op(op: str, req: str, blocks: list[int], group: int, **kw: Any) -> dict[str, Any]:
    return {"op": op, "req": req, "blocks": blocks, "group": group, **kw}


def _steps(let_go: dict[str, Any]) -> list[dict[str, Any]]:
    """a and b share blocks 1, 2 (full) and 3, 4 (window); a lets block 3 go at step 2;
    c is handed block 3 at step 3 while b holds it."""
    return [
        {
            "step": 0,
            "ops": [
                _op("allocate", "a", [1, 2, 8], 0),
                _op("allocate", "a", [3, 4, 5], 1),
                {"op": "append", "req": "a", "tokens": 47},
            ],
        },
        {
            "step": 1,
            "ops": [
                _op("share", "b", [1, 2], 0),
                _op("share", "b", [3, 4], 1),
                _op("allocate", "b", [9], 0),
                _op("allocate", "b", [10], 1),
                {"op": "append", "req": "b", "tokens": 40},
            ],
        },
        {"step": 2, "ops": [let_go]},
        {
            "step": 3,
            "ops": [
                _op("allocate", "c", [11], 0),
                _op("allocate", "c", [3], 1),
                {"op": "append", "req": "c", "tokens": 5},
            ],
        },
    ]


LET_GOS = {
    "window_free": _op("window_free", "a", [3], 1, tokens=47),
    "release": _op("release", "a", [3], 1),
    "free": {"op": "free", "req": "a"},
}


def _lines(let_go: str) -> list[bytes]:
    return [json.dumps(x).encode() for x in (HEADER, *_steps(LET_GOS[let_go]))]


def _held(found: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    return [f for f in found if f[0] == "fresh_while_held"]


@pytest.mark.parametrize("let_go", list(LET_GOS))
def test_replay_names_the_request_that_let_the_block_go_first(let_go: str) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(io.BytesIO(b"\n".join(_lines(let_go)) + b"\n"), keep_going=True)
    found = [(f.check, f.step, f.message) for f in report.findings]
    assert _held(found) == [
        (
            "fresh_while_held",
            3,
            f"request a's {let_go} at step 2 let go of block 3 while others still held it, "
            "then block 3 handed to request c (allocate) while request(s) b hold it",
        )
    ]


@pytest.mark.parametrize("window", [1, 2, 100])
def test_watch_names_it_whatever_the_window(monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    monkeypatch.setattr(steplog, "WINDOW_LINES", window)
    log = StepLog("log.jsonl")
    scratch = duckdb.connect(":memory:")
    for number, line in enumerate(_lines("window_free"), start=1):
        log.add(number, line)
    found = []
    while log.pending:
        found += log.check(scratch)
    held = [(f.check, f.step, f.message) for f in found if f.check == "fresh_while_held"]
    assert held == [
        (
            "fresh_while_held",
            3,
            "request a's window_free at step 2 let go of block 3 while others still held "
            "it, then block 3 handed to request c (allocate) while request(s) b hold it",
        )
    ]


def test_a_block_no_one_held_when_let_go_names_no_culprit() -> None:
    """b's own free ends the last hold: handing block 3 out later is no finding at all;
    a's hold alone, handed to c, names only the holder."""
    steps = _steps(LET_GOS["window_free"])
    steps[1]["ops"] = [_op("allocate", "b", [9], 0), _op("allocate", "b", [10], 1)]
    steps[2]["ops"] = [{"op": "append", "req": "a", "tokens": 0}]
    lines = [json.dumps(x).encode() for x in (HEADER, *steps)]
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(io.BytesIO(b"\n".join(lines) + b"\n"), keep_going=True)
    held = [f.message for f in report.findings if f.check == "fresh_while_held"]
    assert held == ["block 3 handed to request c (allocate) while request(s) a hold it"]
