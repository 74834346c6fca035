"""Hostile step logs and event tables that replay refuses by line and field (no traceback,
no raw DuckDB error, nothing loaded) or reads as a recorder's stop: a group's block size
past any pool, a token count past 2^53 in an event table, a NULL or missing group_id, a
mark whose fields are not what a recorder writes, a last line cut inside a character."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import read_log
from pagedkv_sql.replay.marks import MARK_KEY

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


STEP0 = {
    "step": 0,
    "ops": [
        {"op": "allocate", "req": "a", "blocks": [1, 2], "group": 0},
        {"op": "allocate", "req": "a", "blocks": [3, 4], "group": 1},
        {"op": "append", "req": "a", "tokens": 20},
    ],
}
STEP1 = {
    "step": 1,
    "ops": [
        {"op": "allocate", "req": "b", "blocks": [5], "group": 0},
        {"op": "allocate", "req": "b", "blocks": [6], "group": 1},
        {"op": "append", "req": "b", "tokens": 3},
    ],
}


def events(tmp_path: Path) -> pa.Table:
    log = write(tmp_path / "two.jsonl", TWO_GROUPS, STEP0, STEP1, {"step": 2, "finished": ["b"]})
    return read_log(log)


def as_parquet(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("kind", ["parquet", "arrow table"])
def test_a_table_without_group_id_under_a_header_of_groups_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """Read as group 0 it gave false findings (b's free of its group-1 table)."""
    table = events(tmp_path)
    table = table.drop(["group_id"]).replace_schema_metadata(table.schema.metadata)
    source = as_parquet(table, tmp_path / "nogroup.parquet") if kind == "parquet" else table
    error = refused(source)
    assert "the event table has no group_id column, but its header names 2 KV-cache groups" in (
        error.message
    )


def test_a_table_without_group_id_and_one_group_is_read_as_group_0(tmp_path: Path) -> None:
    log = write(tmp_path / "one.jsonl", {"pagedkv_step_log": 2, "block_size": 16}, STEP_ONE)
    table = read_log(log)
    old = table.drop(["group_id"]).replace_schema_metadata(table.schema.metadata)
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(as_parquet(old, tmp_path / "old.parquet")).ok


STEP_ONE = {
    "step": 0,
    "ops": [
        {"op": "allocate", "req": "a", "blocks": [1]},
        {"op": "append", "req": "a", "tokens": 3},
    ],
}


@pytest.mark.parametrize("kind", ["parquet", "arrow table"])
def test_a_null_group_id_is_refused_naming_its_row(tmp_path: Path, kind: str) -> None:
    table = events(tmp_path)
    i = table.schema.get_field_index("group_id")
    values = table.column("group_id").to_pylist()
    values[5] = None
    table = table.set_column(i, table.schema.field(i), pa.array(values, pa.int64()))
    source = as_parquet(table, tmp_path / "null.parquet") if kind == "parquet" else table
    error = refused(source)
    assert "event table row 5 has a null 'group_id'" in error.message


@pytest.mark.parametrize("value", [2**53 + 1, 2**63 - 1, 2**29 + 1, -1])
@pytest.mark.parametrize("kind", ["parquet", "arrow table"])
def test_a_token_count_out_of_range_is_refused_naming_its_row(
    tmp_path: Path, value: int, kind: str
) -> None:
    table = events(tmp_path)
    i = table.schema.get_field_index("token_to")
    to = pc.if_else(
        pc.equal(table["op"], "append"), pa.scalar(value, pa.int64()), table["token_to"]
    )
    table = table.set_column(i, table.schema.field(i), to)
    source = as_parquet(table, tmp_path / "big.parquet") if kind == "parquet" else table
    row = table.column("op").to_pylist().index("append")
    error = refused(source)
    assert error.message.endswith(
        f"event table row {row}: token_to {value} is out of range (a request holds 0 .. "
        "536,870,912 tokens); nothing was loaded"
    )


@pytest.mark.parametrize(
    ("mark", "said"),
    [
        ({"kind": "gap", "after_step": "x", "dropped": 5}, "mark 'after_step' must be an integer"),
        ({"kind": "gap", "after_step": 1, "dropped": -5}, "mark 'dropped' must not be negative"),
        ({"kind": "gap", "after_step": 1}, "mark 'dropped' must be an integer, not null"),
        ({"kind": "gap", "after_step": -1, "dropped": 2}, "mark 'after_step' must not be neg"),
        ({"kind": "stopped", "after_step": 1, "reason": 7}, "mark 'reason' must be a string"),
        ({"kind": "stopped", "after_step": 1, "reason": "x", "lines_after": -2}, "lines_after"),
        ({"kind": "gip", "after_step": 1, "dropped": 2}, "kind 'gip'"),
    ],
)
def test_a_mark_in_the_schema_metadata_is_validated_as_a_mark_line(
    tmp_path: Path, mark: dict[str, Any], said: str
) -> None:
    table = events(tmp_path)
    meta = {**table.schema.metadata, MARK_KEY.encode(): json.dumps(mark).encode()}
    error = refused(as_parquet(table.replace_schema_metadata(meta), tmp_path / "m.parquet"))
    assert "bad recorder mark in the schema metadata" in error.message and said in error.message


@pytest.mark.parametrize(
    ("after", "said"),
    [
        (999, "after step 999, but the last step read is step 0"),
        (None, "after no step, but the last step read is step 0"),
    ],
)
def test_a_mark_after_a_step_that_was_not_the_last_read_is_refused(
    tmp_path: Path, after: int | None, said: str
) -> None:
    log = write(tmp_path / "g.jsonl", TWO_GROUPS, STEP0, {"gap": 3, "after_step": after})
    error = refused(log)
    assert error.details == [
        f"{log}:3: a recorder mark {said}: a recorder marks where its step lines stop"
    ]
    right = write(tmp_path / "ok.jsonl", TWO_GROUPS, STEP0, {"gap": 3, "after_step": 0})
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(right)
    assert report.mark is not None and report.mark.after_step == 0


@pytest.mark.parametrize("cut", [1, 2])
def test_a_last_line_cut_inside_a_character_is_a_recorders_stop(tmp_path: Path, cut: int) -> None:
    """One or two bytes of a three-byte character: as a cut one byte earlier, the log is
    read as stopped after step 0; the same bytes inside a line are an error of it."""
    head = {"pagedkv_step_log": 2, "block_size": 16, "num_gpu_blocks": 64}
    s0 = {
        "step": 0,
        "ops": [
            {"op": "allocate", "req": "ä", "blocks": [1]},
            {"op": "append", "req": "ä", "tokens": 1},
        ],
    }
    s1 = {"step": 1, "ops": [{"op": "allocate", "req": "日本語", "blocks": [2]}]}
    last = json.dumps(s1, ensure_ascii=False).encode()
    body = (json.dumps(head) + "\n" + json.dumps(s0, ensure_ascii=False) + "\n").encode()
    log = tmp_path / "torn.jsonl"
    log.write_bytes(body + last[: last.index("日".encode()) + cut])
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(log)
    assert report.ok and report.steps == 1
    assert report.mark is not None and (report.mark.kind, report.mark.after_step) == (
        "stopped",
        0,
    )
    assert "was cut off while written" in (report.mark.reason or "")
    log.write_bytes(body + last[: last.index("日".encode()) + cut] + b"\n")
    assert refused(log).details[0].startswith(f"{log}:3: not UTF-8")


@pytest.mark.parametrize("version", [2.0, 1.0, "2", True])
def test_a_header_version_that_is_not_an_integer_is_refused(tmp_path: Path, version: Any) -> None:
    log = write(tmp_path / "v.jsonl", {**TWO_GROUPS, "pagedkv_step_log": version}, STEP0)
    error = refused(log)
    assert f"unsupported step log version {json.dumps(version)}" in error.details[0]
