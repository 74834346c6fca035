"""The step log's header: its KV-cache groups (kind, block size, window), read and written
back; a log whose groups replay cannot check is refused whole, naming them, with the
snapshots as the way to check that engine (never replayed into false findings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import log as steplog
from pagedkv_sql.replay.header import Group, Header, LogLineError, header_from

from .helpers import Cli, snapshot
from .steplogs import write_log

HEADER = {"pagedkv_step_log": 2, "block_size": 16, "num_gpu_blocks": 40, "reserved_blocks": [0]}
SLIDING = {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}
CHUNKED = {"kind": "chunked_local_attention", "block_size": 16, "attention_chunk_size": 32}
FULL = {"kind": "full_attention", "block_size": 16}
MAMBA = {"kind": "mamba", "block_size": 16}
STEPS = [
    {"step": 1, "ops": [{"op": "allocate", "req": "a", "blocks": [1, 2]}]},
    {"step": 2, "ops": [{"op": "free", "req": "a"}]},
]


def appended(req: str, tokens: int) -> dict[str, Any]:
    return {"op": "append", "req": req, "tokens": tokens}


# a Mamba group's table rewritten in place (block 1 left a's table, b reuses it), which
# replay cannot follow: replayed as one full-attention group, two findings
REUSED = [
    {"step": 1, "ops": [{"op": "allocate", "req": "a", "blocks": [1, 2]}, appended("a", 20)]},
    {"step": 2, "ops": [{"op": "allocate", "req": "b", "blocks": [1]}, appended("b", 4)]},
]


def header(**groups: Any) -> dict[str, Any]:
    return {**HEADER, **groups}


def test_the_groups_are_read_and_written_back() -> None:
    h = header_from(header(groups=[SLIDING, {"kind": "mamba", "block_size": 512}]))
    assert h.groups == (Group("sliding_window", 16, 32), Group("mamba", 512))
    assert header_from(json.loads(h.to_json())) == h


def test_a_header_without_groups_is_written_as_before() -> None:
    """No groups: one full-attention group; older readers read the header unchanged."""
    assert "groups" not in json.loads(Header(block_size=16).to_json())
    assert header_from(HEADER).groups == ()


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"kind": "rswa", "block_size": 16}], "'groups'[0].kind must be one of full_attention"),
        ([{"kind": "sliding_window", "block_size": 16}], "sliding_window is required"),
        ([{**FULL, "sliding_window": 8}], "sliding_window is not a field of a full_attention"),
        ([{**FULL, "layers": []}], "'groups'[0]: unknown key(s) layers"),
        ([{"kind": "full_attention", "block_size": 0}], "block_size must be in 1..536,870,912"),
        ([SLIDING, {**SLIDING, "sliding_window": 0}], "'groups'[1].sliding_window must be"),
        ({"kind": "full_attention"}, "header 'groups' must be a list"),
    ],
)
def test_a_bad_group_is_named(groups: Any, message: str) -> None:
    with pytest.raises(LogLineError, match=None) as e:
        header_from(header(groups=groups))
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("groups", "replays"),
    [
        ([], True),
        ([FULL], True),
        ([{**FULL, "block_size": 32}], False),
        ([SLIDING], True),
        ([{**SLIDING, "block_size": 32}], False),
        ([CHUNKED], True),
        ([MAMBA], False),
        ([SLIDING, FULL], True),
        ([SLIDING, {**FULL, "block_size": 32}], False),  # the primary group's block size
        ([{**SLIDING, "block_size": 32}, FULL], True),
        ([FULL, FULL], True),
        ([FULL, MAMBA], False),
    ],
)
def test_replay_takes_attention_groups_not_mamba(groups: Any, replays: bool) -> None:
    assert (header_from(header(groups=groups)).unreplayable() is None) is replays


def test_a_mamba_log_is_refused_whole_naming_its_groups(tmp_path: Path) -> None:
    log = write_log(tmp_path / "local.jsonl", STEPS, header(groups=[MAMBA, FULL]))
    with pytest.raises(InputError) as e:
        steplog.read_log(log)
    assert str(e.value) == (
        f"{log}, line 1: the step log's header: its KV cache is 2 KV-cache group(s) (group 0: "
        "mamba (block size 16); group 1: full_attention (block size 16)): group 0 is mamba, "
        "whose block tables the engine rewrites in place (copy-on-write, relocated state "
        "blocks); replay checks full_attention, sliding_window, chunked_local_attention groups "
        "only; the log was not replayed"
    )
    assert "PAGEDKV_SNAPSHOT_EVERY=N" in e.value.hint
    assert "pagedkv-sql import vllm" in e.value.hint


def test_an_event_table_with_such_a_header_is_refused_too() -> None:
    table = steplog.read_jsonl([json.dumps(HEADER), *map(json.dumps, STEPS)], "<test>")
    meta = {b"pagedkv_step_log": json.dumps(header(groups=[MAMBA]))}
    with pytest.raises(InputError, match=r"<swa> \(the header in its schema metadata\).*"):
        steplog.conform(table.replace_schema_metadata(meta), "<swa>")
    assert steplog.conform(table, "<full>").num_rows == table.num_rows


def test_the_cli_refuses_it_with_no_finding_and_nothing_stored(tmp_path: Path) -> None:
    """Exit 1 (data), the groups named, the Fix: the snapshots, no finding (replayed as
    one full-attention group, these steps give two); the database unchanged."""
    cli = Cli(tmp_path)
    write_log(tmp_path / "full.jsonl", STEPS, HEADER)
    write_log(tmp_path / "local.jsonl", REUSED, header(groups=[MAMBA]))
    assert cli("replay", "full.jsonl", "--db", "kv.duckdb").exit_code == 0  # type: ignore[attr-defined]
    before = snapshot(tmp_path / "kv.duckdb")
    r: Any = cli("replay", "local.jsonl", "--db", "kv.duckdb", "--keep-going")
    assert r.exit_code == 1
    assert "finding" not in r.output.lower()
    assert "local.jsonl, line 1: the step log's header" in r.output
    assert "Fix: check the engine's snapshots instead" in r.output
    assert snapshot(tmp_path / "kv.duckdb") == before


def test_the_library_refuses_it_as_the_cli_does(tmp_path: Path) -> None:
    log = write_log(tmp_path / "local.jsonl", STEPS, header(groups=[MAMBA]))
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError, match="line 1"):
        db.replay(log, keep_going=True)
    assert isinstance(steplog.read_log(write_log(tmp_path / "f.jsonl", STEPS, HEADER)), pa.Table)
