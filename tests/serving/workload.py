"""The serving tier's workload and what it compares: requests as token ids (a shared
two-block prefix, tails and lengths that overflow the 16-block pool, so that vLLM preempts
and evicts cached blocks), the live manager's tokens and the replayed ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pagedkv_sql

from .helpers import BLOCK_SIZE

PREFIX = list(range(10, 10 + 2 * BLOCK_SIZE))  # two full blocks every prompt shares
Token = tuple[str, int, int]  # (request id, token_pos, block_id * 256 + offset)


def prompt(i: int) -> list[int]:
    """Request i's prompt: the shared prefix and a tail of 5..33 tokens."""
    return PREFIX + [100 + i] * (5 + 7 * (i % 5))


def max_tokens(i: int) -> int:
    return 20 + 9 * (i % 4)


def requests(n: int = 24) -> list[tuple[str, list[int], int]]:
    """(request id, prompt, max_tokens) of the workload's n requests."""
    return [(f"r{i}", prompt(i), max_tokens(i)) for i in range(n)]


def live_tokens(manager: Any, scheduler_requests: dict[str, Any]) -> list[Token]:
    """Every token whose KV the live vLLM has written (``num_computed_tokens`` of each
    request: the token just sampled has no KV yet), at its block, sorted."""
    group = manager.coordinator.single_type_managers[0]
    out = []
    for rid, request in scheduler_requests.items():
        blocks = group.req_to_blocks.get(rid, [])
        for p in range(int(request.num_computed_tokens)):
            out.append((str(rid), p, int(blocks[p // BLOCK_SIZE].block_id) * 256 + p % BLOCK_SIZE))
    return sorted(out)


def replayed_tokens(db: pagedkv_sql.Database, step: int) -> list[Token]:
    """The stored log's state at the end of ``step``, token by token (header defaults:
    block_bytes 256, gpu_base 0, so an address is block_id * 256 + offset)."""
    db.replay_at(step)
    rows = db.sql(
        "SELECT l.request_id, a.token_pos, a.physical_address FROM resolved_kv_address a "
        "JOIN pagedkv_request_label l USING (seq_id) ORDER BY ALL"
    ).fetchall()
    return [(str(r), int(p), int(a)) for r, p, a in rows]


class Served:
    """A recorded run of the workload: its log and recorder, and the live manager's tokens
    at a step in mid-flight and at the end."""

    log: Path
    recorder: Any  # record_vllm.Recorder
    mid_step: int
    mid_live: list[Token]
    end_step: int
    end_live: list[Token]


def findings(log: Path, db_path: Path | str = ":memory:") -> list[Any]:
    """Every finding of replaying ``log``."""
    with pagedkv_sql.connect(db_path) as db:
        return list(db.replay(log, keep_going=True).findings)


class Planted:
    """Where a planted fault fired: the recorder's step, the request, the block."""

    step: int | None = None
    request: str | None = None
    block: int | None = None


def abort_all(e: Any) -> None:
    """End a faulty run: abort what is left (by vLLM's internal ids)."""
    ids = list(e.engine.output_processor.request_states)
    if ids:
        e.engine.abort_request(ids, internal=True)
    assert not e.engine.has_unfinished_requests() and not e.scheduler.requests
