"""The conformance suite's plants (tests/test_invariants.py): each idea of the catalogue
planted once, as each model that claims it reads the cache, and what each model found.

A plant is one bug told in every model's input language: a step log (replay), the state at
the step the bug happens as an engine holds it (the engine views and the fast check), the
spec's four relations (the state the log replays to at that step, or the engine's import
of its state), a stream of prefix-cache events (live). ``found(plant, model)`` runs one
model and gives what it found as (check, step, requests, blocks).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

import pagedkv_sql
from pagedkv_sql import invariants
from pagedkv_sql.engines import Snapshot
from pagedkv_sql.engines.fastcheck import check_state
from pagedkv_sql.engines.tables import EngineState, Pool, table, write
from pagedkv_sql.errors import ConstraintError
from pagedkv_sql.invariants import ENGINE, FASTCHECK, FLEET, LIVE, REPLAY, SPEC
from pagedkv_sql.replay.log import read_jsonl

BLOCK = 4  # tokens a block, in the logs and the engine states alike
POOL = 10  # blocks 0 .. 9; block 0 is reserved (vLLM's null block)
HEADER = {
    "pagedkv_step_log": 1,
    "block_size": BLOCK,
    "num_gpu_blocks": POOL,
    "reserved_blocks": [0],
}


@dataclass(frozen=True)
class Found:
    check: str
    step: int | None
    requests: tuple[str, ...]
    blocks: tuple[int, ...]


@dataclass
class Plant:
    """One idea planted once: where it happens (step, request, block: None where no model
    names one) and each model's input."""

    step: int | None = None
    request: str | None = None
    block: int | None = None
    log: list[dict[str, Any]] | None = None  # replay: the steps after HEADER
    spec_at: int | None = None  # spec: the log's state at this step ...
    spec_facts: dict[str, list[tuple[int, ...]]] | None = None  # ... or these relations
    spec_engine: bool = False  # ... or the engine state's import
    engine: Callable[[], EngineState | Snapshot] | None = None
    events: list[dict[str, Any]] | None = None  # live: TensorRT-LLM event JSON lines
    fleet: Callable[[], Any] | None = None  # fleet: a tests/fleet_fixtures.py Fleet
    header: dict[str, Any] = field(default_factory=lambda: dict(HEADER))


def alloc(req: str, *blocks: int) -> dict[str, Any]:
    return {"op": "allocate", "req": req, "blocks": list(blocks)}


def append(req: str, n: int) -> dict[str, Any]:
    return {"op": "append", "req": req, "tokens": n}


# r1 holds blocks 1, 2 with 6 tokens; r2 shares block 1 and holds 3 with 5 tokens
BASE = [
    {"step": 0, "ops": [alloc("r1", 1, 2), append("r1", 6)]},
    {
        "step": 1,
        "ops": [{"op": "share", "req": "r2", "blocks": [1]}, alloc("r2", 3), append("r2", 5)],
    },
]
BASE_TABLES = {"r1": [1, 2], "r2": [1, 3]}
BASE_TOKENS = {"r1": 6, "r2": 5}


def engine_state(
    tables: dict[str, list[int]],
    tokens: dict[str, int],
    *,
    ref_cnt: dict[int, int] | None = None,
    free: list[int] | None = None,
    free_count: int | None = None,
) -> EngineState:
    """A vLLM-like state: block lists, token counts, every block's ref_cnt (default: its
    holders), the free queue (default: the blocks nobody holds), null block 0."""
    ids = list(tables)
    holders: dict[int, int] = {}
    for blocks in tables.values():
        for b in blocks:
            holders[b] = holders.get(b, 0) + 1
    counts = {b: holders.get(b, 0) for b in range(POOL)}
    counts.update(ref_cnt or {})
    queue = free if free is not None else [b for b in range(1, POOL) if not holders.get(b)]
    seq = [i for i, r in enumerate(ids) for _ in tables[r]]
    return EngineState(
        engine="vllm",
        block_size=BLOCK,
        requests=table(
            "engine_request",
            seq_id=np.arange(len(ids)),
            request_id=ids,
            num_tokens=[tokens[r] for r in ids],
        ),
        block_table=table(
            "engine_block_table",
            seq_id=seq,
            group_id=[0] * len(seq),
            block_index=[j for r in ids for j in range(len(tables[r]))],
            pool_id=[0] * len(seq),
            block_id=[b for r in ids for b in tables[r]],
        ),
        pools=[Pool(0, "kv", num_blocks=POOL, free_count=free_count)],
        blocks=table(
            "engine_block",
            pool_id=[0] * POOL,
            block_id=list(range(POOL)),
            ref_cnt=[counts[b] for b in range(POOL)],
            is_null=[True] + [False] * (POOL - 1),
        ),
        free_blocks=table(
            "engine_free_block",
            pool_id=[0] * len(queue),
            position=list(range(len(queue))),
            block_id=queue,
        ),
    )


# -- the models ---------------------------------------------------------------------------------
def found(plant: Plant, model: str) -> list[Found]:
    return {
        REPLAY: _replay,
        SPEC: _spec,
        ENGINE: _engine_views,
        FASTCHECK: _fastcheck,
        LIVE: _live,
        FLEET: _fleet,
    }[model](plant)


def _log(plant: Plant) -> pa.Table:
    assert plant.log is not None
    lines = [json.dumps(plant.header)] + [json.dumps(s) for s in plant.log]
    return read_jsonl(lines, "<plant>")


def _replay(plant: Plant) -> list[Found]:
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(_log(plant), keep_going=True)
    return [Found(f.check, f.step, f.request_ids, f.block_ids) for f in report.findings]


def _state(plant: Plant) -> EngineState:
    assert plant.engine is not None
    made = plant.engine()
    if isinstance(made, Snapshot):
        from pagedkv_sql.engines.registry import engine

        return engine(made.engine).to_state(made)  # type: ignore[no-any-return]
    return made


def _engine_views(plant: Plant) -> list[Found]:
    with pagedkv_sql.connect(":memory:") as db:
        report = write(db.con, _state(plant), "<plant>")
        return [_found(f, None) for result in report.warnings for f in result.findings]


def _fastcheck(plant: Plant) -> list[Found]:
    return [Found(f.check, None, f.request_ids, f.block_ids) for f in check_state(_state(plant))]


def _spec(plant: Plant) -> list[Found]:
    with pagedkv_sql.connect(":memory:") as db:
        try:
            if plant.spec_at is not None:
                db.replay(_log(plant))
                db.replay_at(plant.spec_at)
            elif plant.spec_engine:
                write(db.con, _state(plant), "<plant>")
            else:
                assert plant.spec_facts is not None
                for relation, rows in plant.spec_facts.items():
                    columns = pagedkv_sql.relations.INPUT_RELATIONS[relation]
                    arrays = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
                    db.load_arrow(relation, pa.table(arrays, schema=_schema(relation)), append=True)
        except ConstraintError as e:  # a spec constraint: the rows are refused
            return [Found(v.check, None, (), ()) for v in e.violations]
        return [_found(f, plant.spec_at) for r in db.check().results for f in r.findings]


def _found(f: Any, step: int | None) -> Found:
    return Found(f.check, step, f.request_ids, f.block_ids)


def _schema(relation: str) -> pa.Schema:
    from pagedkv_sql.relations import arrow_schema

    return arrow_schema(relation)


def _live(plant: Plant) -> list[Found]:
    from pagedkv_sql.live.recorded import check_stream

    assert plant.events is not None
    data = "".join(json.dumps(e) + "\n" for e in plant.events).encode()
    report = check_stream(io.BytesIO(data), "<plant>", keep=None)
    return [Found(f.check, None, f.request_ids, f.block_ids) for f in report.findings]


def _fleet(plant: Plant) -> list[Found]:
    import tempfile
    from pathlib import Path

    from pagedkv_sql import fleet

    assert plant.fleet is not None
    with tempfile.TemporaryDirectory() as tmp, pagedkv_sql.connect(":memory:") as db:
        report = fleet.check(db, plant.fleet().write(Path(tmp) / "fleet"))
    return [Found(f.check, None, f.request_ids, f.block_ids) for f in report.findings]


def checks_of(model: str, name: str) -> tuple[str, ...]:
    """The checks the catalogue names for idea ``name`` in ``model`` (the fast check's by
    the engine view's name, which its findings carry)."""
    inv = invariants.BY_NAME[name]
    if model == FASTCHECK:
        return inv.checks.get(ENGINE, ())
    return inv.checks.get(model, ())
