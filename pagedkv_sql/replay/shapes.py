"""The step shapes of vLLM's SchedulerOutput a step log may carry (docs/replay.md): a new
request's whole block tables (``new_requests`` / ``scheduled_new_reqs``), a running
request's new blocks (``running`` / ``scheduled_cached_reqs``), one list of block ids per
KV-cache group; each told to the Builder as its operations."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import witness
from .header import (
    LogLineError,
    as_block_ids,
    as_block_slots,
    as_count,
    as_list,
    as_request_id,
    request_of,
)

if TYPE_CHECKING:
    from .builder import Builder


def group_blocks(b: Builder, value: Any, what: str) -> list[list[int | None]]:
    """Block ids of each KV-cache group: a list of one group's ids, or vLLM's tuple of
    one list per group (``null``: a placeholder entry)."""
    if len(b.groups) == 1:
        return [list(as_block_ids(value, what))]
    lists = as_list(value, what)
    if len(lists) != len(b.groups):
        raise LogLineError(
            f"{what} must be one list of block ids per KV-cache group ({len(b.groups)} "
            f"in the header), not {json.dumps(value)[:60]}"
        )
    return [as_block_slots(v, f"{what}[{g}]") for g, v in enumerate(lists)]


def prefix(
    b: Builder, req: str, computed: int, per_group: list[list[int | None]], asked: Any
) -> None:
    """A new or resumed request's tables: in each group, the entries that hold its
    ``computed`` tokens shared (a prefix hit), the rest allocated."""
    for g, blocks in enumerate(per_group):
        hits = min(computed // b.block_size(g), len(blocks))
        hashes = asked(hits) if g == 0 and asked is not None else None
        b.acquire("share", req, blocks[:hits], hashes, group=g)
        b.acquire("allocate", req, blocks[hits:], group=g)


def new_request(
    b: Builder, new: Mapping[str, Any], scheduled: Mapping[str, Any], what: str
) -> None:
    req = request_of(new, what)
    per_group = group_blocks(b, new.get("block_ids", []), f"{what}.block_ids")
    computed = as_count(new.get("num_computed_tokens", 0), f"{what}.num_computed_tokens")
    now = as_count(
        new.get("num_scheduled_tokens", scheduled.get(req, 0)),
        f"{what}.num_scheduled_tokens",
    )
    witness.refuse_v2(b.version, new, what)
    b.create(req)
    prefix(b, req, computed, per_group, lambda hits: witness.hashes(new, hits, what))
    b.append(req, computed + now)


def running(
    b: Builder, req: str, new_blocks: Any, computed: Any, now: Any, resumed: Any, what: str
) -> None:
    per_group = group_blocks(
        b,
        new_blocks if new_blocks is not None else [[] for _ in b.groups],
        f"{what}.new_block_ids",
    )
    if computed is None:
        raise LogLineError(f"{what} needs 'num_computed_tokens'")
    total = as_count(computed, f"{what}.num_computed_tokens") + as_count(
        now, f"{what}.num_scheduled_tokens"
    )
    b.known(req)
    if not isinstance(resumed, bool):
        raise LogLineError(f"{what}.resumed_from_preemption must be true or false")
    if resumed:
        b.preempt(req)
        prefix(b, req, as_count(computed, "num_computed_tokens"), per_group, None)
        b.append(req, total)
        return
    for g, blocks in enumerate(per_group):
        b.acquire("allocate", req, blocks, group=g)
    held = b.requests[req].tokens
    if b.requests[req].alive and total < held:
        raise LogLineError(f"{what}: request {req} would hold {total} tokens, fewer than {held}")
    b.append(req, total)


def cached_columns(b: Builder, cached: Mapping[str, Any], scheduled: Mapping[str, Any]) -> None:
    ids = as_list(cached.get("req_ids", []), "scheduled_cached_reqs.req_ids")
    n = len(ids)
    new_blocks = cached.get("new_block_ids") or [None] * n
    computed = cached.get("num_computed_tokens") or [None] * n
    resumed = cached.get("resumed_from_preemption") or [False] * n
    for name, col in (
        ("new_block_ids", new_blocks),
        ("num_computed_tokens", computed),
        ("resumed_from_preemption", resumed),
    ):
        if len(as_list(col, f"scheduled_cached_reqs.{name}")) != n:
            raise LogLineError(f"scheduled_cached_reqs.{name} has not {n} entries (req_ids)")
    for i, req in enumerate(ids):
        req = as_request_id(req, f"scheduled_cached_reqs.req_ids[{i}]")
        running(
            b,
            req,
            new_blocks[i],
            computed[i],
            scheduled.get(req, 0),
            resumed[i],
            f"scheduled_cached_reqs[{i}]",
        )
