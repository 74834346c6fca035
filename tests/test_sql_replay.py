"""The fast replay plan (sql/replay.sql) against the plain one it replaced
(tests/replay_plain.sql: window passes by request and by block, token counts by ASOF join,
request ids as strings) on random logs: the same findings row for row, and the same state
at every step."""

from __future__ import annotations

import dataclasses
import random
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.errors import UsageError
from pagedkv_sql.replay import engine, stored_events, synth
from pagedkv_sql.replay.log import Builder, Header, LogLineError
from pagedkv_sql.replay.log import write_events as engine_write
from pagedkv_sql.sqlfiles import parse

from .steplogs import op as apply_op

PLAIN = Path(__file__).with_name("replay_plain.sql")


@cache
def plain_statements() -> dict[str, str]:
    return {s.name: s.sql.rstrip().rstrip(";") for s in parse(PLAIN.read_text(), PLAIN.name)}


def plain_findings(events: pa.Table) -> list[tuple[Any, ...]]:
    """Every finding of the plain plan."""
    header = Header() if not events.schema.metadata else engine.header_of(events)
    con = duckdb.connect(":memory:")
    try:
        con.execute(engine.sql("create_replay_log"))
        con.execute(
            "CREATE TABLE replay_event AS SELECT * FROM events"
        )  # the event table's own columns: request as a string
        engine.insert_header(con, header)
        plain = plain_statements()
        for name in (
            "build_replay_request",
            "build_replay_location",
            "build_replay_tokens",
            "build_replay_holder_change",
        ):
            con.execute(plain[name])
        cols = ", ".join(engine.FINDING_COLUMNS)
        union = "\nUNION ALL\n".join(
            f"SELECT * FROM ({plain[n]}) AS t({cols})"
            for n in plain
            if n.startswith("replay_check_")
        )
        return sorted(con.execute(union).fetchall(), key=repr)
    finally:
        con.close()


def plain_state(events: pa.Table, step: int) -> dict[str, set[tuple[Any, ...]]]:
    """The entries and token counts at the end of ``step``, by a plain reading of the events."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("CREATE TABLE e AS SELECT * FROM events")
        entries = con.execute(
            """
            SELECT request, block_index, op, block_id, cpu_address FROM (
                SELECT *, row_number() OVER (PARTITION BY request, block_index
                                             ORDER BY event DESC) AS last
                FROM e WHERE block_index IS NOT NULL AND step <= ?
            ) WHERE last = 1
              AND op IN ('allocate', 'share', 'fork', 'swap_in', 'swap_out')
            """,
            [step],
        ).fetchall()
        tokens = con.execute(
            """
            SELECT request, arg_max(coalesce(token_to, 0), event) FROM e
            WHERE step <= ? AND ((op = 'append' AND token_to IS NOT NULL)
               OR (op IN ('free', 'preempt') AND block_index IS NULL AND block_id IS NULL
                   AND cpu_address IS NULL))
            GROUP BY request HAVING arg_max(coalesce(token_to, 0), event) > 0
            """,
            [step],
        ).fetchall()
    finally:
        con.close()
    return {
        "entries": {
            (r, i, "cpu" if op == "swap_out" or b is None else "gpu")
            + ((None, c) if op == "swap_out" or b is None else (b, None))
            for r, i, op, b, c in entries
        },
        "tokens": set(tokens),
    }


def fast_state(db: pagedkv_sql.Database, step: int) -> dict[str, set[tuple[Any, ...]]]:
    con = db.con
    return {
        "entries": set(
            con.execute(
                "SELECT request, block_index, tier, block_id, cpu_address "
                "FROM replay_entries_at(?)",
                [step],
            ).fetchall()
        ),
        "tokens": set(
            con.execute("SELECT request, tokens FROM replay_tokens_at(?)", [step]).fetchall()
        ),
    }


def assert_given_back(db: pagedkv_sql.Database, events: pa.Table) -> None:
    """The stored log gives back the event table it was read from, row for row, in event
    order."""
    back = stored_events(db)
    expected = events.sort_by("event")
    assert back.schema.equals(expected.schema, check_metadata=False)
    assert back.to_pylist() == expected.to_pylist()


def compare(events: pa.Table, steps: list[int] | None = None) -> list[tuple[Any, ...]]:
    """Replay ``events`` both ways and assert the findings (and states) are the same, and
    that the stored log gives the events back."""
    expected = plain_findings(events)
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(events, keep_going=True)
        found = sorted((dataclasses.astuple(f)[:-1] for f in report.findings), key=repr)
        assert found == expected
        first = db.replay(keep_going=False).first
        if expected:
            # the first finding: at the earliest step, cause first (catalogue rank) there
            assert first is not None and first.step == min(f[2] for f in expected)
            assert dataclasses.astuple(first)[:-1] in expected
        else:
            assert first is None
        for step in steps or []:
            assert fast_state(db, step) == plain_state(events, step), step
        assert_given_back(db, events)
    return expected


def synth_events(cfg: synth.StepSynthConfig) -> pa.Table:
    builder = Builder(synth.header(cfg))
    for step in synth.steps(cfg):
        builder.step(step)
    return builder.table()


@pytest.mark.parametrize("seed", range(6))
def test_synthetic_logs_with_random_faults(seed: int) -> None:
    rng = random.Random(seed)
    names = rng.sample(sorted(synth.FAULTS), rng.randint(0, 4))
    faults = tuple((name, rng.randint(30, 280)) for name in names)
    cfg = synth.StepSynthConfig(
        steps=300,
        num_gpu_blocks=rng.choice([96, 160, 1024]),  # small pools swap and evict
        max_running=rng.choice([8, 24]),
        block_size=rng.choice([1, 4, 16]),
        prompt_tokens=rng.choice([20, 64]),
        output_tokens=rng.choice([30, 120]),
        seed=seed,
        faults=faults,
    )
    while True:
        try:
            events = synth_events(cfg)
            break
        except UsageError:  # a fault that cannot be planted at its step (nothing to break)
            faults = faults[1:]
            cfg = dataclasses.replace(cfg, faults=faults)
    found = compare(events, steps=[0, 77, 150, 299])
    for name, step in faults:
        assert (name, step) in {(f[0], f[2]) for f in found}, (name, step)


# a few hashes, so that shares ask for the hash their block is cached under, or another
HASHES = [f"{n:016x}" for n in (1, (1 << 64) - 1)]
REQS = ["a", "b", "c", "d"]
BLOCKS = st.integers(1, 9)
CACHED = st.integers(1, 3)  # the blocks cached and shared with hashes: few, so they meet

# the witness of format version 2: hashes cached and asked for, what a free gave back, the
# free list observed
witness = [
    st.builds(
        lambda b, h: {"op": "cache", "blocks": b, "hashes": h[: len(b)]},
        st.lists(CACHED, min_size=1, max_size=2),
        st.lists(st.sampled_from(HASHES), min_size=2, max_size=2),
    ),
    st.builds(
        lambda r, b, h: {"op": "share", "req": r, "blocks": b, "hashes": h[: len(b)]},
        st.sampled_from(REQS),
        st.lists(CACHED, min_size=1, max_size=2),
        st.lists(st.sampled_from([*HASHES, None]), min_size=2, max_size=2),
    ),
    st.builds(
        lambda o, r, h: {"op": o, "req": r, "handed": h},
        st.sampled_from(["free", "preempt"]),
        st.sampled_from(REQS),
        st.lists(BLOCKS, max_size=3),
    ),
    st.builds(lambda f: {"op": "observe", "free_list": f}, st.lists(BLOCKS, max_size=3)),
]
# test_replay_apply's operations, the engine's own counts, and the witness
op = st.one_of(
    apply_op,
    st.builds(
        lambda b, n, f: {"op": "observe", "ref_cnt": {str(b): n}, "num_free_blocks": f},
        st.integers(1, 9),
        st.integers(0, 3),
        st.integers(0, 8),
    ),
    *witness,
)
# the witness with what it meets: blocks allocated, tokens appended, blocks evicted
witness_op = st.one_of(
    *witness,
    st.builds(
        lambda r, b: {"op": "allocate", "req": r, "blocks": [b]},
        st.sampled_from(REQS),
        CACHED,
    ),
    st.builds(
        lambda r, n: {"op": "append", "req": r, "tokens": n},
        st.sampled_from(REQS),
        st.integers(1, 5),
    ),
    st.builds(lambda b: {"op": "evict", "blocks": [b]}, CACHED),
)


def replay_random(steps: list[list[Any]]) -> None:
    """Replay the readable prefix of random steps both ways (compare)."""
    builder = Builder(Header(block_size=4, num_gpu_blocks=8, reserved_blocks=(0,)))
    rows = 0
    for n, ops in enumerate(steps):
        try:
            builder.step({"step": n, "ops": ops})
        except LogLineError:  # not a readable step (a request that never existed): stop
            break
        rows = len(builder.columns["event"])
    events = builder.table().slice(0, rows)
    if events.num_rows:
        compare(events, steps=list(range(int(events.column("step")[-1].as_py()) + 1)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(op, min_size=1, max_size=4), min_size=1, max_size=10))
def test_random_operation_sequences(steps: list[list[Any]]) -> None:
    replay_random(steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(witness_op, min_size=1, max_size=4), min_size=1, max_size=10))
def test_random_witness_sequences(steps: list[list[Any]]) -> None:
    replay_random(steps)


def test_request_keys_by_join_give_the_same_findings() -> None:
    """Two request ids that hash alike make replay key requests by seq_id through a join:
    the findings are the same either way."""
    cfg = synth.StepSynthConfig(
        steps=200, num_gpu_blocks=128, max_running=16, seed=9, faults=(("double_free", 120),)
    )
    events = synth_events(cfg)
    con = duckdb.connect(":memory:")
    out = []
    for by_join in (False, True):
        with pagedkv_sql.connect(con) as db:
            engine.load_events(db.con, events, validate=True, _intern_by_join=by_join)
            out.append([f.to_dict() for f in engine.check(db.con, keep_going=True).findings])
            db.replay_at(150)
            out.append(db.con.execute("SELECT * FROM virtual_token ORDER BY ALL").fetchall())
    assert out[0] == out[2] and out[1] == out[3]
    assert out[0]


def alloc(req: str, *blocks: int) -> dict[str, Any]:
    return {"op": "allocate", "req": req, "blocks": list(blocks)}


def append(req: str, n: int) -> dict[str, Any]:
    return {"op": "append", "req": req, "tokens": n}


H = [f"{n:016x}" for n in (7, 8, 9)]
EDGE_LOGS = {
    # tokens appended in the step that releases their block: the group's interval ends at
    # its last append's step
    "append_then_release_same_step": [
        [alloc("a", 1), append("a", 2)],
        [append("a", 1), {"op": "release", "req": "a", "blocks": [1]}],
    ],
    # a preempted request written again: two lives of one block index
    "preempt_and_resume": [
        [alloc("a", 1, 2), append("a", 6)],
        [{"op": "preempt", "req": "a"}],
        [alloc("a", 3), append("a", 2)],
        [alloc("b", 3), alloc("a", 4)],
    ],
    # a block acquired for an index whose tokens were written before it
    "late_block": [
        [alloc("a", 1), append("a", 7)],
        [{"op": "share", "req": "a", "blocks": [2]}],
    ],
    # the witness of format version 2: a hit on a block cached under another hash (at
    # the share, and at a cache while the sharer holds it); a free that keeps a block back,
    # and one that gives a block back twice; a held block, and a block twice, in the free
    # list
    "witness": [
        [alloc("a", 1, 2, 5), append("a", 9), {"op": "cache", "blocks": [1, 2], "hashes": H[:2]}],
        [{"op": "share", "req": "b", "blocks": [2, 1], "hashes": H[:2]}, append("b", 8)],
        [{"op": "share", "req": "c", "blocks": [3], "hashes": H[:1]}, append("c", 1)],
        [{"op": "cache", "blocks": [3], "hashes": H[2:]}, {"op": "evict", "blocks": [2]}],
        [
            {"op": "free", "req": "a", "handed": [1, 2]},
            {"op": "free", "req": "c", "handed": [3, 3]},
        ],
        [{"op": "observe", "free_list": [1, 4, 4]}],
    ],
    # swapped out and in again between appends: the group spans several intervals
    "swap_between_appends": [
        [alloc("a", 1), append("a", 1)],
        [{"op": "swap_out", "req": "a", "cpu": [4096]}, append("a", 1)],
        [{"op": "swap_in", "req": "a", "blocks": [5]}, append("a", 1)],
        [{"op": "evict", "blocks": [5]}, {"op": "free", "req": "a"}],
    ],
}


@pytest.mark.parametrize("name", sorted(EDGE_LOGS))
def test_edge_logs(name: str) -> None:
    builder = Builder(Header(block_size=4, num_gpu_blocks=8))
    for n, ops in enumerate(EDGE_LOGS[name]):
        builder.step({"step": n, "ops": ops})
    found = compare(builder.table(), steps=list(range(len(EDGE_LOGS[name]))))
    assert found or name == "swap_between_appends"
    if name == "witness":
        assert {(f[0], f[2], f[4], f[6]) for f in found} >= {
            ("prefix_hash", 1, "b", 2),
            ("prefix_hash", 1, "b", 1),
            ("prefix_hash", 3, "c", 3),
            ("leak", 4, "a", 5),
            ("double_free", 4, "c", 3),
            ("held_free_block", 5, "b", 1),
            ("free_list_duplicate", 5, None, 4),
        }, found


def _valid_table() -> pa.Table:
    builder = Builder(Header(block_size=4, num_gpu_blocks=8))
    builder.step({"step": 0, "ops": [alloc("a", 1), append("a", 5)]})
    builder.step({"step": 1, "ops": [{"op": "evict", "blocks": [3]}]})
    builder.step({"step": 2, "observed": {"ref_cnt": {"1": 1}, "num_free_blocks": 6}})
    return builder.table()


@pytest.mark.parametrize(
    ("op", "change", "message"),
    [
        ("evict", {"request": "a"}, "evict names no request"),
        ("allocate", {"request": None}, "allocate needs a request"),
        ("allocate", {"block_id": None}, "allocate needs a block_id"),
        ("observe_ref", {"value": None}, "observe_ref needs a value"),
        ("observe_free", {"value": None}, "observe_free needs a value"),
        ("append", {"token_to": None}, "append needs both token_from and token_to"),
        ("append", {"token_to": 0, "token_from": 3}, "append of tokens [3, 0) is not a range"),
        ("allocate", {"block_index": -1}, "block_index -1 is negative"),
        ("allocate", {"block_id": -2}, "block_id -2 is negative"),
        ("append", {"op": "teleport"}, "unknown operation 'teleport'"),
        ("append", {"step": -1}, "step -1 is negative"),
    ],
)
def test_the_quick_format_check_sends_every_bad_row_to_be_named(
    op: str, change: dict[str, Any], message: str
) -> None:
    """replay_event_quick_check counts what replay_event_problems names: a row it let pass
    would be loaded unchecked."""
    table = _valid_table()
    rows = table.to_pylist()
    row = next(r for r in rows if r["op"] == op)
    row.update(change)
    bad = pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata(
        table.schema.metadata
    )
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.InputError) as e:
        db.replay(bad)
    assert any(message in d for d in e.value.details), e.value.details


def test_a_valid_table_with_its_rows_shuffled_loads() -> None:
    table = _valid_table()
    shuffled = table.take(list(reversed(range(table.num_rows))))
    with pagedkv_sql.connect(":memory:") as db:
        ordered = db.replay(table, keep_going=True)
        report = db.replay(shuffled, keep_going=True)
    assert (report.steps, report.events, report.findings) == (
        ordered.steps,
        ordered.events,
        ordered.findings,
    )


def _with(table: pa.Table, **columns: list[Any]) -> pa.Table:
    """``table`` with some columns replaced (same schema and header)."""
    out = table
    for name, values in columns.items():
        i = out.schema.get_field_index(name)
        out = out.set_column(i, out.schema.field(name), pa.array(values, pa.int64()))
    return out.replace_schema_metadata(table.schema.metadata)


def _growing(steps: int = 12) -> pa.Table:
    """Two requests growing a token a step, one of them preempted and resumed, with
    a step in which one appends twice and a step in which one appends nothing."""
    builder = Builder(Header(block_size=4, num_gpu_blocks=16))
    builder.step({"step": 0, "ops": [alloc("a", 1, 2), alloc("b", 3), append("a", 3)]})
    for n in range(1, steps):
        ops: list[Any] = [append("a", 1)]
        if n % 4 == 0:
            ops.append(alloc("a", 4 + n // 4))
        if n != 5:
            ops.append(append("b", 1))
        if n == 6:
            ops += [append("b", 1), append("b", 1)]
        if n == 8:
            ops += [{"op": "preempt", "req": "b"}, alloc("b", 12), append("b", 2)]
        builder.step({"step": n, "ops": ops})
    return builder.table()


def test_a_log_with_runs_of_appends_and_odd_steps() -> None:
    compare(_growing(), steps=list(range(12)))


@pytest.mark.parametrize(
    "change",
    ["event_gaps", "huge_steps", "huge_tokens", "shuffled", "append_names_a_block"],
)
def test_logs_with_gaps_huge_numbers_or_odd_rows(change: str) -> None:
    """Event numbers with gaps, steps and token positions past 2^31, rows out of order, an
    append row that names a block: the same findings and states as the plain plan, and the
    log given back as it was read."""
    events = _growing()
    n = events.num_rows
    steps = list(range(12))
    if change == "event_gaps":
        events = _with(events, event=[3 * e + 7 for e in events.column("event").to_pylist()])
    elif change == "huge_steps":
        base = 1 << 31
        events = _with(events, step=[base + s for s in events.column("step").to_pylist()])
        steps = [(1 << 31) + s for s in steps]
    elif change == "huge_tokens":  # every append moved past 2^31 (small ranges still)
        moved = {
            name: [None if t is None else t + (1 << 31) for t in events.column(name).to_pylist()]
            for name in ("token_from", "token_to")
        }
        events = _with(events, **moved)
    elif change == "shuffled":
        events = events.take(list(reversed(range(n))))
    else:
        ops = events.column("op").to_pylist()
        i = ops.index("append", n // 2)
        block = events.column("block_id").to_pylist()
        block[i] = 2
        events = _with(events, block_id=block)
    if change == "huge_tokens":  # not contiguous any more: only the log given back is compared
        with pagedkv_sql.connect(":memory:") as db:
            db.replay(events)
            assert_given_back(db, events)
        return
    compare(events, steps=steps)


def test_synthetic_logs_given_back_from_parquet(tmp_path: Path) -> None:
    """A Parquet log (scanned in place) replays to the same findings as its Arrow table and
    gives its events back exactly."""
    cfg = synth.StepSynthConfig(
        steps=400, num_gpu_blocks=128, max_running=16, seed=3, faults=(("evict_held", 200),)
    )
    events = synth_events(cfg)
    path = tmp_path / "log.parquet"
    engine_write(events, path)
    with pagedkv_sql.connect(":memory:") as db:
        from_parquet = db.replay(path, keep_going=True)
        assert_given_back(db, events)
        at = [fast_state(db, s) for s in (0, 133, 266, 399)]
    with pagedkv_sql.connect(":memory:") as db:
        from_arrow = db.replay(events, keep_going=True)
        assert at == [fast_state(db, s) for s in (0, 133, 266, 399)]
    assert from_parquet.findings == from_arrow.findings and from_parquet.findings
