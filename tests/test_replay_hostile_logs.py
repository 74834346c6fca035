"""Hostile step logs and event tables that replay refuses by line and field (no traceback,
no raw DuckDB error, nothing loaded) or reads as a recorder's stop: a group's block size
past any pool, a token count past 2^53 in an event table, a NULL or missing group_id, a
mark whose fields are not what a recorder writes, a last line cut inside a character."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError

TWO_GROUPS = {
    "pagedkv_step_log": 2,
    "block_size": 16,
    "num_gpu_blocks": 64,
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 32},
    ],
}


def write(path: Path, *lines: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def refused(source: Any) -> InputError:
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as e:
            db.replay(source)
        assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(0,)]
    return e.value


@pytest.mark.parametrize("size", [2**62, 2**63 - 1, 2**29 + 1])
@pytest.mark.parametrize("kind", ["sliding_window", "chunked_local_attention"])
@pytest.mark.parametrize("last", ["share", "window_free"])
def test_a_group_block_size_past_any_pool_is_an_error_of_the_header(
    tmp_path: Path, size: int, kind: str, last: str
) -> None:
    window = "sliding_window" if kind == "sliding_window" else "attention_chunk_size"
    header = {
        **TWO_GROUPS,
        "groups": [TWO_GROUPS["groups"][0], {"kind": kind, "block_size": size, window: 32}],
    }
    step0 = {
        "step": 0,
        "ops": [
            {"op": "allocate", "req": "a", "blocks": [1, 2], "group": 0},
            {"op": "allocate", "req": "a", "blocks": [3, 4], "group": 1},
            {"op": "append", "req": "a", "tokens": 20},
        ],
    }
    if last == "share":
        ops = [
            {"op": "share", "req": "b", "blocks": [1], "group": 0},
            {"op": "share", "req": "b", "blocks": [3, 4], "group": 1},
        ]
    else:
        ops = [{"op": "window_free", "req": "a", "blocks": [4], "tokens": 20, "group": 1}]
    log = write(tmp_path / "bs.jsonl", header, step0, {"step": 1, "ops": ops})
    error = refused(log)
    assert error.details[0] == (
        f"{log}:1: header 'groups'[1].block_size must be in 1..536,870,912 (no block holds "
        f"more tokens than a pool), not {size}"
    )


def test_the_largest_group_block_size_replays(tmp_path: Path) -> None:
    header = {
        **TWO_GROUPS,
        "groups": [
            TWO_GROUPS["groups"][0],
            {"kind": "sliding_window", "block_size": 2**29, "sliding_window": 32},
        ],
    }
    step0 = {
        "step": 0,
        "ops": [
            {"op": "allocate", "req": "a", "blocks": [1, 2], "group": 0},
            {"op": "allocate", "req": "a", "blocks": [3, 4], "group": 1},
            {"op": "append", "req": "a", "tokens": 20},
        ],
    }
    free = {"op": "window_free", "req": "a", "blocks": [4], "tokens": 20, "group": 1}
    log = write(tmp_path / "bs.jsonl", header, step0, {"step": 1, "ops": [free]})
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(log, keep_going=True).findings == []
