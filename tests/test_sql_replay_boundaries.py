"""`replay --at N` and `diff` at every interval boundary: a block allocated, shared, swapped
out (the GPU tier to the CPU tier), swapped back in, or freed exactly at step N, each
compared with the state the log says at N, written out by hand below."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.replay.log import Header

from .steplogs import HEADER, alloc, append

CPU = 4096
STEPS: list[dict[str, Any]] = [
    {"step": 0, "ops": [alloc("a", 1, 2), append("a", 6)]},  # allocated
    {"step": 1, "ops": [{"op": "share", "req": "b", "blocks": [1]}, alloc("b", 3), append("b", 5)]},
    {"step": 2, "ops": [{"op": "swap_out", "req": "a", "blocks": [2], "cpu": [CPU]}]},
    {"step": 3, "ops": [{"op": "swap_in", "req": "a", "blocks": [4]}]},
    {"step": 4, "ops": [{"op": "free", "req": "b"}]},
    {"step": 5, "ops": [append("a", 1)]},  # no boundary: nothing but tokens changes
]
# the state the log says at the end of each step: entries (request, index) -> tier, where;
# tokens per request
STATES: list[tuple[dict[tuple[str, int], tuple[str, int]], dict[str, int]]] = [
    ({("a", 0): ("gpu", 1), ("a", 1): ("gpu", 2)}, {"a": 6}),
    (
        {("a", 0): ("gpu", 1), ("a", 1): ("gpu", 2), ("b", 0): ("gpu", 1), ("b", 1): ("gpu", 3)},
        {"a": 6, "b": 5},
    ),
    (
        {("a", 0): ("gpu", 1), ("a", 1): ("cpu", CPU), ("b", 0): ("gpu", 1), ("b", 1): ("gpu", 3)},
        {"a": 6, "b": 5},
    ),
    (
        {("a", 0): ("gpu", 1), ("a", 1): ("gpu", 4), ("b", 0): ("gpu", 1), ("b", 1): ("gpu", 3)},
        {"a": 6, "b": 5},
    ),
    ({("a", 0): ("gpu", 1), ("a", 1): ("gpu", 4)}, {"a": 6}),
    ({("a", 0): ("gpu", 1), ("a", 1): ("gpu", 4)}, {"a": 7}),
]
BOUNDARY = ["allocated", "shared", "swapped out", "swapped in", "freed", "none"]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = tmp_path_factory.mktemp("at") / "log.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in [HEADER, *STEPS]))
    with pagedkv_sql.connect(tmp_path_factory.mktemp("db") / "r.duckdb") as database:
        assert database.replay(path).ok
        yield database


def _refcounts(entries: dict[tuple[str, int], tuple[str, int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for tier, where in entries.values():
        if tier == "gpu":
            counts[where] = counts.get(where, 0) + 1
    return counts


def _materialized(
    db: Any,
) -> tuple[dict[tuple[str, int], tuple[str, int]], dict[str, int], dict[int, int]]:
    header = Header(block_size=4)
    names = dict(db.con.execute("SELECT seq_id, request_id FROM replay_request").fetchall())
    entries: dict[tuple[str, int], tuple[str, int]] = {}
    refcounts: dict[int, int] = {}
    for seq, index, base, refcount in db.con.execute(
        "SELECT block_table_id, block_index, physical_block_base, refcount FROM block_table_entry"
    ).fetchall():
        block = (base - header.gpu_base) // header.block_bytes
        entries[(names[seq], index)] = ("gpu", block)
        assert refcounts.setdefault(block, refcount) == refcount
    for seq, index, cpu in db.con.execute(
        "SELECT block_table_id, block_index, cpu_base_address FROM swapped_block"
    ).fetchall():
        entries[(names[seq], index)] = ("cpu", cpu)
    tokens = {
        names[seq]: n
        for seq, n in db.con.execute(
            "SELECT seq_id, count(*) FROM virtual_token GROUP BY seq_id"
        ).fetchall()
    }
    return entries, tokens, refcounts


@pytest.mark.parametrize("step", range(len(STEPS)), ids=BOUNDARY)
def test_the_state_at_a_boundary_is_the_logs(db: Any, step: int) -> None:
    db.replay_at(step)
    entries, tokens = STATES[step]
    assert _materialized(db) == (entries, tokens, _refcounts(entries))


def _changes(a: int, b: int) -> set[tuple[Any, ...]]:
    """The diff the states say, in replay_diff's words."""
    (ea, ta), (eb, tb) = STATES[a], STATES[b]

    def where(entry: tuple[str, int] | None) -> str | None:
        if entry is None:
            return None
        return f"gpu block {entry[1]}" if entry[0] == "gpu" else f"cpu {entry[1]}"

    out: set[tuple[Any, ...]] = set()
    for key in ea.keys() | eb.keys():
        x, y = ea.get(key), eb.get(key)
        if x == y:
            continue
        change = (
            "entry added"
            if x is None
            else "entry removed"
            if y is None
            else "swapped out"
            if (x[0], y[0]) == ("gpu", "cpu")
            else "swapped in"
            if (x[0], y[0]) == ("cpu", "gpu")
            else "moved"
        )
        out.add((change, key[0], key[1], None, where(x), where(y)))
    for r in ta.keys() ^ tb.keys():
        out.add(("request arrived" if r in tb else "request gone", r, None, None, None, None))
    for r in ta.keys() | tb.keys():
        if ta.get(r, 0) != tb.get(r, 0):
            out.add(("tokens", r, None, None, str(ta.get(r, 0)), str(tb.get(r, 0))))
    ra, rb = _refcounts(ea), _refcounts(eb)
    for block in ra.keys() | rb.keys():
        if ra.get(block, 0) != rb.get(block, 0):
            out.add(("refcount", None, None, block, str(ra.get(block, 0)), str(rb.get(block, 0))))
    return out


@pytest.mark.parametrize("step", range(1, len(STEPS)), ids=BOUNDARY[1:])
def test_the_diff_across_a_boundary_is_the_logs(db: Any, step: int) -> None:
    got = {
        (r["change"], r["request"], r["block_index"], r["block_id"], r["before"], r["after"])
        for r in db.diff(step - 1, step).to_pylist()
    }
    assert got == _changes(step - 1, step)
    back = {
        (r["change"], r["request"], r["block_index"], r["block_id"], r["before"], r["after"])
        for r in db.diff(step, step - 1).to_pylist()
    }
    assert back == _changes(step, step - 1)


def test_the_diff_from_the_first_to_the_last_step_is_the_logs(db: Any) -> None:
    got = {
        (r["change"], r["request"], r["block_index"], r["block_id"], r["before"], r["after"])
        for r in db.diff(0, len(STEPS) - 1).to_pylist()
    }
    assert got == _changes(0, len(STEPS) - 1)
