"""Step-log builders for the replay tests: a header, the allocate, append and release ops,
a log as a table, and the findings of a replay that keeps going."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import log as steplog

HEADER = {"pagedkv_step_log": 1, "block_size": 4, "num_gpu_blocks": 16, "reserved_blocks": [0]}


def alloc(req: str, *blocks: int) -> dict[str, Any]:
    return {"op": "allocate", "req": req, "blocks": list(blocks)}


def append(req: str, n: int) -> dict[str, Any]:
    return {"op": "append", "req": req, "tokens": n}


def release(req: str, *blocks: int) -> dict[str, Any]:
    return {"op": "release", "req": req, "blocks": list(blocks)}


def table(steps: list[dict[str, Any]], header: dict[str, Any] = HEADER) -> pa.Table:
    lines = [json.dumps(header)] + [json.dumps(s) for s in steps]
    return steplog.read_jsonl(lines, "<test>")


def findings(steps: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table(steps), keep_going=True)
    return [(f.check, f.step, f.op, f.request, f.other_requests) for f in report.findings]


BASE = [
    {"step": 0, "ops": [alloc("a", 1, 2), append("a", 6)]},
    {"step": 1, "ops": [{"op": "share", "req": "b", "blocks": [1]}, alloc("b", 3), append("b", 5)]},
    {
        "step": 2,
        "ops": [append("a", 1)],
        "observed": {"ref_cnt": {"1": 2, "2": 1}, "num_free_blocks": 12},
    },
]


REQS = ["a", "b", "c", "d"]
BLOCKS = list(range(1, 10))


op = st.one_of(
    st.builds(
        lambda r, b: {"op": "allocate", "req": r, "blocks": b},
        st.sampled_from(REQS),
        st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=2),
    ),
    st.builds(
        lambda r, b: {"op": "share", "req": r, "blocks": [b]},
        st.sampled_from(REQS),
        st.sampled_from(BLOCKS),
    ),
    st.builds(
        lambda r, n: {"op": "append", "req": r, "tokens": n},
        st.sampled_from(REQS),
        st.integers(1, 5),
    ),
    st.builds(
        lambda r, p: {"op": "fork", "req": r, "parent": p},
        st.sampled_from(REQS),
        st.sampled_from(REQS),
    ),
    st.builds(lambda r: {"op": "free", "req": r}, st.sampled_from(REQS)),
    st.builds(lambda r: {"op": "preempt", "req": r}, st.sampled_from(REQS)),
    st.builds(
        lambda r, b: {"op": "release", "req": r, "blocks": [b]},
        st.sampled_from(REQS),
        st.sampled_from(BLOCKS),
    ),
    st.builds(
        lambda r, c: {"op": "swap_out", "req": r, "cpu": [c * 4096]},
        st.sampled_from(REQS),
        st.integers(1, 50),
    ),
    st.builds(
        lambda r, b: {"op": "swap_in", "req": r, "blocks": [b]},
        st.sampled_from(REQS),
        st.sampled_from(BLOCKS),
    ),
    st.builds(lambda b: {"op": "evict", "blocks": [b]}, st.sampled_from(BLOCKS)),
)


def structs(array_like: bool) -> Any:
    """Structs with vLLM's field order: array_like=True is the older, tagged-array layout."""

    class EventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int | bytes]
        medium: str | None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def stream(array_like: bool) -> list[Any]:
    Batch, Stored, Removed, Cleared = structs(array_like)
    return [
        Batch(1.0, [Stored([11, 12], None, list(range(32)), 16, None, "GPU")]),
        Batch(2.0, [Stored([13], 12, list(range(16)), 16, None, "GPU"), Removed([13], "GPU")]),
        Batch(3.0, [Removed([99], "GPU"), Stored([21], 77, [0] * 16, 16, None, "GPU")]),
        Batch(4.0, [Cleared(), Removed([11], "GPU")]),
    ]


LOG_HEADER = {"pagedkv_step_log": 1, "block_size": 4, "num_gpu_blocks": 64, "reserved_blocks": [0]}


def write_log(path: Path, steps: list[Any], header: dict[str, Any] | None = LOG_HEADER) -> Path:
    lines = ([json.dumps(header)] if header else []) + [
        s if isinstance(s, str) else json.dumps(s) for s in steps
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


ALLOC = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}


def refused_lines(path: Path) -> str:
    with pytest.raises(InputError) as e:
        steplog.read_log(path)
    return "\n".join([str(e.value), *e.value.details])


WINDOW, WINDOW_BLOCK = 32, 16  # a sliding-window log's window and block size, tokens
WINDOW_HEADER = {
    "pagedkv_step_log": 2,
    "block_size": WINDOW_BLOCK,
    "num_gpu_blocks": 40,
    "reserved_blocks": [0],
    "groups": [{"kind": "sliding_window", "block_size": WINDOW_BLOCK, "sliding_window": WINDOW}],
}


def alloc_slots(req: str, blocks: list[Any], op: str = "allocate") -> dict[str, Any]:
    return {"op": op, "req": req, "blocks": blocks}


def window_free(req: str, blocks: list[int], tokens: int) -> dict[str, Any]:
    return {"op": "window_free", "req": req, "blocks": blocks, "tokens": tokens}


def window_log(freed_at: int = 49, block: int = 1, hit: int = 50) -> list[dict[str, Any]]:
    """a holds 49 tokens in 4 blocks; at 49 processed tokens the window keeps positions
    18 on, so its block 0 (block 1) leaves it and b takes block 1; c's prefix hit of 50
    tokens starts with a placeholder (positions 0..15 are out of its window)."""
    return [
        {"step": 1, "ops": [alloc_slots("a", [1, 2, 3, 4]), append("a", 49)]},
        {
            "step": 2,
            "ops": [window_free("a", [block], freed_at), alloc_slots("b", [1]), append("b", 4)],
        },
        {"step": 3, "ops": [alloc_slots("c", [None, 2, 3, 4], "share"), append("c", hit)]},
        {"step": 4, "ops": [{"op": "free", "req": r} for r in "abc"]},
    ]
