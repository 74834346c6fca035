"""Step-log builders for the replay tests: a header, the allocate, append and release ops,
a log as a table, and the findings of a replay that keeps going."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

import pagedkv_sql
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
    return [(f.invariant, f.step, f.op, f.request, f.other_requests) for f in report.findings]
