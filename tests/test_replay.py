"""Replay: each invariant found at its step over the whole log at once; the state at a step
materialized into the spec's tables; diff."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import PagedKVError, UsageError

from .helpers import snapshot
from .steplogs import BASE, HEADER, alloc, append


def run(steps: list[dict[str, Any]], keep_going: bool = True) -> list[tuple[str, int]]:
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in steps]
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(_table(lines), keep_going=keep_going)
    return [(f.check, f.step) for f in report.findings]


def _table(lines: list[str]) -> Any:
    from pagedkv_sql.replay.log import read_jsonl

    return read_jsonl(lines, "<test>")


def test_a_clean_log_breaks_nothing() -> None:
    assert run(BASE) == []


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        # vLLM #37076: a block handed out fresh while another request holds it
        ({"ops": [alloc("c", 2)]}, [("fresh_while_held", 3), ("stale_token", 3)]),
        # vLLM #42571: freed more often than acquired
        (
            {"ops": [{"op": "release", "req": "a", "blocks": [2, 2]}]},
            [("double_free", 3), ("unresolved_token", 3)],  # the cause first
        ),
        ({"observed": {"ref_cnt": {"1": 1}}}, [("refcount_mismatch", 3)]),
        ({"observed": {"num_free_blocks": 13}}, [("free_count", 3)]),
        ({"finished": ["b"], "ops": [append("b", 1)]}, [("freed_request_referenced", 3)]),
        ({"ops": [append("a", 2)]}, [("unresolved_token", 3)]),
        ({"ops": [{"op": "share", "req": "a", "blocks": [1]}]}, [("duplicate_block", 3)]),
        ({"ops": [{"op": "evict", "blocks": [3]}]}, [("evict_held", 3), ("stale_token", 3)]),
        ({"ops": [alloc("c", 16)]}, [("outside_pool", 3)]),
        ({"ops": [alloc("c", 0)]}, [("outside_pool", 3)]),
        (
            {"ops": [{"op": "swap_out", "req": "b", "blocks": [3], "cpu": [100]}]},
            [("unaligned_cpu_address", 3)],
        ),
        ({"ops": [append("a", 2), alloc("a", 5)]}, [("stale_token", 3)]),
    ],
)
def test_each_invariant_at_its_step(step: dict[str, Any], expected: list[tuple[str, int]]) -> None:
    later = {"step": 4, "ops": [alloc("z", 9)]}
    assert run([*BASE, {"step": 3, **step}, later]) == expected


def test_a_refcount_mismatch_names_the_request_that_last_changed_the_block() -> None:
    """An engine that skips a decrement when b is freed reports ref_cnt 1 for
    block 3, which no entry holds: the finding names b (its free), not just the block."""
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in BASE]
    lines.append(json.dumps({"step": 3, "finished": ["b"], "observed": {"ref_cnt": {"3": 1}}}))
    with pagedkv_sql.connect(":memory:") as db:
        (f,) = db.replay(_table(lines), keep_going=True).findings
    assert (f.check, f.step, f.request, f.block_id) == ("refcount_mismatch", 3, "b", 3)
    assert f.message.endswith("(last changed by request b's free)"), f.message


def test_the_first_finding_names_request_and_block() -> None:
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in BASE]
    lines.append(json.dumps({"step": 48213, "ops": [alloc("B", 2)]}))
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(_table(lines))
    assert len(report.findings) == 1
    f = report.findings[0]
    assert (f.step, f.op, f.request, f.other_requests, f.block_id) == (
        48213,
        "allocate",
        "B",
        "a",
        2,
    )
    assert f.message == "block 2 handed to request B (allocate) while request(s) a hold it"


def test_state_at_a_step_equals_loading_it_as_facts() -> None:
    steps = [
        *BASE,
        {
            "step": 3,
            "ops": [
                {"op": "swap_out", "req": "b", "cpu": [4096, 8192]},
                {"op": "fork", "req": "c", "parent": "a"},
            ],
        },
        {"step": 4, "finished": ["a"]},
    ]
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in steps]
    with pagedkv_sql.connect(":memory:") as db:
        db.replay(_table(lines))
        done = db.replay_at(3)
        assert done.rows == {
            "root_table": 3,
            "block_table_entry": 4,
            "virtual_token": 19,
            "swapped_block": 2,
        }
        rows = {
            r: sorted(db.con.execute(f"SELECT * FROM {r}").fetchall())
            for r in ("root_table", "block_table_entry", "swapped_block")
        }
        assert rows["root_table"] == [(1, 1), (2, 2), (3, 3)]
        # block 1 is held by a, b... b swapped out, so by a and its fork c
        assert rows["block_table_entry"] == [
            (1, 0, 256, 2),
            (1, 1, 512, 2),
            (3, 0, 256, 2),
            (3, 1, 512, 2),
        ]
        assert rows["swapped_block"] == [(2, 0, 4096), (2, 1, 8192)]
        assert db.check().errors == 0 and db.check().warnings == 0
        resolved = db.resolve_table().to_pylist()
        assert {"seq_id": 2, "token_pos": 4, "physical_address": 8192} in resolved
        assert db.explain(3, 6).resolutions[0].physical_address == 512 + 2
        assert db.explain(3, 6).request_id == "c"  # the engine's id, from replay_request
        db.replay_at(4)
        assert (
            db.sql("SELECT count(*) AS n FROM root_table").to_arrow_table().column("n")[0].as_py()
            == 2
        )
        ids = db.sql("SELECT * FROM replay_request ORDER BY seq_id").to_arrow_table().to_pylist()
        assert [(r["seq_id"], r["request_id"]) for r in ids] == [(1, "a"), (2, "b"), (3, "c")]


def test_a_failed_materialize_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in BASE]
    path = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(path) as db:
        db.replay(_table(lines))
        db.replay_at(1)
    before = snapshot(path)
    with pagedkv_sql.connect(path) as db:
        with pytest.raises(UsageError, match="after the log's last step"):
            db.replay_at(7)
        db.con.execute("UPDATE replay_log SET gpu_base = 8")  # bases no longer aligned
        with pytest.raises(PagedKVError, match="cannot materialize step 2"):
            db.replay_at(2)
    assert snapshot(path) == before


def test_diff_between_steps() -> None:
    steps = [
        *BASE,
        {
            "step": 3,
            "ops": [{"op": "swap_out", "req": "b", "blocks": [3], "cpu": [4096]}],
            "finished": ["a"],
        },
    ]
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in steps]
    with pagedkv_sql.connect(":memory:") as db:
        db.replay(_table(lines))
        changes = {
            (r["change"], r["request"], r["block_index"], r["block_id"], r["before"], r["after"])
            for r in db.diff(2, 3).to_pylist()
        }
    assert changes == {
        ("entry removed", "a", 0, None, "gpu block 1", None),
        ("entry removed", "a", 1, None, "gpu block 2", None),
        ("request gone", "a", None, None, None, None),
        ("swapped out", "b", 1, None, "gpu block 3", "cpu 4096"),
        ("tokens", "a", None, None, "7", "0"),
        ("refcount", None, None, 1, "2", "1"),
        ("refcount", None, None, 2, "1", "0"),
        ("refcount", None, None, 3, "1", "0"),
    }


def test_a_log_stored_by_an_older_version_is_a_clear_error() -> None:
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in BASE]
    with pagedkv_sql.connect(":memory:") as db:
        db.replay(_table(lines))
        db.con.execute("DROP TABLE replay_written")  # the first plan had no such table
        with pytest.raises(UsageError, match="stored by an older pagedkv-sql"):
            db.replay()
        with pytest.raises(UsageError, match="older"):
            db.replay_at(1)


# one way to plug in: the replay entry points take the Database itself
def test_the_entry_points_take_the_database(tmp_path: Path) -> None:
    from pagedkv_sql import replay

    path = tmp_path / "log.jsonl"
    steps = [
        {"step": 0, "ops": [alloc("a", 1), append("a", 2)]},
        {"step": 1, "ops": [append("a", 1)]},
    ]
    path.write_text("\n".join([json.dumps(HEADER)] + [json.dumps(s) for s in steps]) + "\n")
    with pagedkv_sql.connect(":memory:") as db:
        assert replay.run(db, path).ok
        back = replay.stored_events(db)
        assert back.num_rows == 4  # the arrive, the allocate, the two appends
        assert replay.diff(db, 0, 1).column("change").to_pylist() == ["tokens"]
        assert replay.at(db, 0).step == 0


def test_a_stored_step_log_replays_on_a_read_only_open(tmp_path: Path) -> None:
    from pagedkv_sql.replay.log import read_jsonl

    header = {"pagedkv_step_log": 1, "block_size": 4, "num_gpu_blocks": 8, "reserved_blocks": [0]}
    step = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}
    log = read_jsonl([json.dumps(header), json.dumps(step)], "<test>")
    file = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(file) as db:
        assert db.replay(log).findings == []
    with pagedkv_sql.connect(file, read_only=True) as db:
        assert db.replay().findings == []
        with pytest.raises(pagedkv_sql.UsageError, match="open read-only"):
            db.replay(log)


def test_at_one_step_the_cause_comes_first_and_its_consequence_names_it() -> None:
    """Request a releases block 2 twice: the double free is printed first (the first
    finding, too), and the tokens it leaves without a block name it as their cause."""
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in BASE]
    lines.append(json.dumps({"step": 3, "ops": [{"op": "release", "req": "a", "blocks": [2, 2]}]}))
    with pagedkv_sql.connect(":memory:") as db:
        every = db.replay(_table(lines), keep_going=True)
        first = db.replay(keep_going=False)
    assert [(f.check, f.invariant, f.cause) for f in every.findings] == [
        ("double_free", "double_free", None),
        ("unresolved_token", "unresolved_token", "double_free at step 3 (request a; block 2)"),
    ]
    assert [f.check for f in first.findings] == ["double_free"]
    assert every.counts == {"double_free": 1, "unresolved_token": 1}


def test_evict_held_names_the_requests_that_hold_the_block() -> None:
    lines = [json.dumps(HEADER)] + [json.dumps(s) for s in BASE]
    lines.append(json.dumps({"step": 3, "ops": [{"op": "evict", "blocks": [3]}]}))
    with pagedkv_sql.connect(":memory:") as db:
        (f, *_) = db.replay(_table(lines), keep_going=True).findings
    assert (f.check, f.request_ids, f.block_ids) == ("evict_held", ("b",), (3,))
    assert f.message == "block 3 evicted while request(s) b hold it"
