"""replay/log.py's reader, line by line: the header, the ops, bad lines and their counts."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import log as steplog

from .steplogs import ALLOC, HEADER, LOG_HEADER, alloc, append, refused_lines, table, write_log


def test_a_new_request_without_scheduled_tokens_holds_its_computed_tokens_only() -> None:
    new = {"req_id": "a", "block_ids": [[1, 2]], "num_computed_tokens": 4}
    rows = table([{"step": 0, "new_requests": [new]}]).to_pylist()
    assert [(r["op"], r["token_from"], r["token_to"]) for r in rows if r["op"] == "append"] == [
        ("append", 0, 4)
    ]


@pytest.mark.parametrize("name", ["d.arrow", "d.parquet"])
def test_an_event_table_path_that_cannot_be_read_is_an_input_error(
    tmp_path: Any, name: str
) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "x").write_text("not arrow")
    with pytest.raises(InputError, match="not a readable event table"):
        steplog.read_events(tmp_path / name)
    if name.endswith(".parquet"):  # the reader that hands a Parquet log to DuckDB by name
        with pytest.raises(InputError, match="not a readable event table"):
            steplog.parquet_events(tmp_path / name)


def test_an_event_table_of_other_integer_and_string_types_is_cast_and_a_float_refused() -> None:
    good = table([{"step": 0, "ops": [alloc("a", 1), append("a", 2)]}])
    narrow = good.cast(
        pa.schema(
            [
                pa.field(f.name, pa.int32() if f.type == pa.int64() else pa.large_string())
                for f in good.schema
            ]
        )
    )
    assert steplog.conform(narrow, "x").equals(good)
    coded = good.set_column(2, "op", good.column("op").dictionary_encode())
    assert steplog.conform(coded, "x").equals(good)
    floats = good.set_column(1, "step", good.column("step").cast(pa.float64()))
    with pytest.raises(InputError, match="column step is double, not int64"):
        steplog.conform(floats, "x")


def test_a_fork_s_child_gets_the_parent_s_tokens_from_position_0() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1, 2), append("a", 6)]},
        {"step": 1, "ops": [{"op": "fork", "req": "b", "parent": "a"}]},
    ]
    rows = table(steps).to_pylist()
    assert [
        (r["request"], r["token_from"], r["token_to"]) for r in rows if r["op"] == "append"
    ] == [
        ("a", 0, 6),
        ("b", 0, 6),
    ]


def test_the_stored_log_comes_back_with_its_header_and_every_event() -> None:
    from pagedkv_sql.replay import stored_events

    header = {**HEADER, "engine": "vllm", "block_bytes": 512, "gpu_base": 4096}
    log = table([{"step": 0, "ops": [alloc("a", 1), append("a", 2)]}], header)
    with pagedkv_sql.connect(":memory:") as db:
        db.replay(log)
        back = stored_events(db)
    assert back.equals(log)
    assert steplog.header_of(back) == steplog.header_of(log)
    assert steplog.header_of(back).engine == "vllm"


def test_a_bad_step_log_counts_its_bad_lines() -> None:
    lines = [json.dumps(HEADER), "{not json", json.dumps({"step": 0}), '"a string"']
    with pytest.raises(InputError) as e:
        steplog.read_jsonl(lines, "<test>")
    assert str(e.value).startswith("<test>: 2 line(s) of the step log cannot be read;")
    assert len(e.value.details) == 2


def test_a_parquet_log_is_left_for_duckdb_to_scan(tmp_path: Any) -> None:
    from pagedkv_sql.replay.log import event_source as read

    log = table([{"step": 0, "ops": [alloc("a", 1), append("a", 2)]}])
    steplog.write_events(log, tmp_path / "run.parquet")
    found, validate = read(tmp_path / "run.parquet")
    assert isinstance(found, steplog.ParquetEvents) and validate
    found, validate = read(str(tmp_path / "run.parquet"))
    assert isinstance(found, steplog.ParquetEvents)
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(tmp_path / "run.parquet").events == 3


def test_an_event_table_with_a_bad_header_in_its_metadata_is_refused() -> None:
    log = table([{"step": 0, "ops": [alloc("a", 1)]}])
    for bad in ('{"pagedkv_step_log": 1, "block_size": 0}', "{not json"):
        with pytest.raises(InputError, match="bad step-log header in the schema metadata"):
            steplog.conform(log.replace_schema_metadata({steplog.HEADER_KEY: bad}), "x")


def test_a_running_request_that_would_hold_fewer_tokens_than_it_holds_is_a_bad_line() -> None:
    new = {
        "req_id": "a",
        "block_ids": [[1, 2]],
        "num_computed_tokens": 0,
        "num_scheduled_tokens": 8,
    }
    shrink = {
        "req_id": "a",
        "new_block_ids": [[]],
        "num_computed_tokens": 2,
        "num_scheduled_tokens": 1,
    }
    with pytest.raises(InputError) as e:
        table([{"step": 0, "new_requests": [new]}, {"step": 1, "running": [shrink]}])
    assert "request a would hold 3 tokens, fewer than 8" in e.value.details[0]


def test_a_header_without_block_size_means_16_tokens_a_block() -> None:
    log = table([{"step": 0, "ops": [alloc("a", 1)]}], {"pagedkv_step_log": 1})
    assert steplog.header_of(log).block_size == 16


def test_a_resumed_request_shares_its_computed_blocks_and_allocates_the_rest() -> None:
    new = {"req_id": "a", "block_ids": [[1]], "num_computed_tokens": 0, "num_scheduled_tokens": 4}
    resumed = {
        "req_id": "a",
        "new_block_ids": [[5, 6, 7]],
        "num_computed_tokens": 4,
        "num_scheduled_tokens": 5,
        "resumed_from_preemption": True,
    }
    rows = table([{"step": 0, "new_requests": [new]}, {"step": 1, "running": [resumed]}])
    got = [(r["op"], r["block_index"], r["block_id"]) for r in rows.to_pylist() if r["step"] == 1]
    assert [g for g in got if g[0] in ("share", "allocate")] == [
        ("share", 0, 5),
        ("allocate", 1, 6),
        ("allocate", 2, 7),
    ]


def test_vllm_columnar_cached_requests_without_resumed_flags_are_not_resumed() -> None:
    new = {"req_id": "a", "block_ids": [[1]], "num_computed_tokens": 0, "num_scheduled_tokens": 4}
    cached = {"req_ids": ["a"], "new_block_ids": [[[2]]], "num_computed_tokens": [4]}
    step = {"step": 1, "scheduled_cached_reqs": cached, "num_scheduled_tokens": {"a": 1}}
    rows = table([{"step": 0, "new_requests": [new]}, step]).to_pylist()
    got = [
        (r["op"], r["block_index"], r["block_id"], r["token_to"]) for r in rows if r["step"] == 1
    ]
    assert got == [("allocate", 1, 2, None), ("append", None, None, 5)]


def test_a_negative_block_id_is_a_bad_line() -> None:
    with pytest.raises(InputError) as e:
        table([{"step": 0, "ops": [alloc("a", 1, -3)]}])
    assert "block id -3 is negative" in e.value.details[0]


@pytest.mark.parametrize(
    ("value", "ok"), [(-(2**63), True), (-(2**63) - 1, False), (2**63 - 1, True), (2**63, False)]
)
def test_an_observed_count_must_be_a_signed_64_bit_integer(value: int, ok: bool) -> None:
    step = {"step": 0, "ops": [alloc("a", 1)], "observed": {"ref_cnt": {"1": value}}}
    if ok:
        assert [r["value"] for r in table([step]).to_pylist() if r["op"] == "observe_ref"] == [
            value
        ]
    else:
        with pytest.raises(InputError) as e:
            table([step])
        assert f"{value} is out of the signed 64-bit range" in e.value.details[0]


def test_a_step_log_is_read_from_a_binary_stream() -> None:
    lines = [json.dumps(HEADER), json.dumps({"step": 0, "ops": [alloc("a", 1), append("a", 2)]})]
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(io.BytesIO(("\n".join(lines) + "\n").encode()))
    assert (report.steps, report.events, report.findings) == (1, 3, [])


def test_a_header_with_no_gpu_block_is_refused() -> None:
    with pytest.raises(InputError) as e:
        table([{"step": 0}], {"pagedkv_step_log": 1, "num_gpu_blocks": 0})
    assert "header 'num_gpu_blocks' must be positive, not 0" in e.value.details[0]


def test_a_step_log_without_a_header_has_16_tokens_a_block() -> None:
    log = steplog.read_jsonl([json.dumps({"step": 0, "ops": [alloc("a", 1)]})], "<test>")
    assert steplog.header_of(log).block_size == 16


def test_a_running_request_without_scheduled_tokens_holds_its_computed_tokens_only() -> None:
    new = {"req_id": "a", "block_ids": [[1]], "num_computed_tokens": 0, "num_scheduled_tokens": 2}
    run = {"req_id": "a", "new_block_ids": [[]], "num_computed_tokens": 3}
    rows = table([{"step": 0, "new_requests": [new]}, {"step": 1, "running": [run]}]).to_pylist()
    assert [(r["token_from"], r["token_to"]) for r in rows if r["op"] == "append"] == [
        (0, 2),
        (2, 3),
    ]


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("gpu_base", 128, False),
        ("gpu_base", 512, True),
        ("block_size", 256, True),
        ("block_size", 257, False),
    ],
)
def test_header_bounds(key: str, value: int, ok: bool) -> None:
    header = {**HEADER, key: value}
    if ok:
        assert getattr(steplog.header_of(table([{"step": 0}], header)), key) == value
    else:
        with pytest.raises(InputError):
            table([{"step": 0}], header)


def test_a_step_log_of_1001_bad_lines_names_1000_and_counts_all() -> None:
    with pytest.raises(InputError) as e:
        steplog.read_jsonl([json.dumps(HEADER)] + ["{bad"] * 1001, "<test>")
    assert len(e.value.details) == 1000
    assert str(e.value).startswith("<test>: 1001 line(s) of the step log cannot be read")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "a step must be an object"),
        ('{"ops": []}', "needs a 'step' number"),
        ('{"step": 1.5}', "'step' must be an integer"),
        ('{"step": 0}', "step 0 is out of order: it follows step 0"),
        ('{"step": 1, "ops": [{"op": "teleport", "req": "a"}]}', 'unknown operation "teleport"'),
        (
            '{"step": 1, "ops": [{"op": "append", "req": "ghost", "tokens": 1}]}',
            "request ghost never existed",
        ),
        ('{"step": 1, "finished": ["ghost"]}', "request ghost never existed"),
        ('{"step": 1, "bogus": 1}', "unknown key(s) bogus"),
        (
            '{"step": 1, "ops": [{"op": "allocate", "req": "a", "blocks": ["x"]}]}',
            "must be an integer",
        ),
        (
            '{"step": 1, "ops": [{"op": "swap_out", "req": "a", "cpu": [1, 2, 3]}]}',
            "1 block(s) but 3 cpu address(es)",
        ),
        (
            '{"step": 1, "new_requests": [{"req_id": "a", "block_ids": [3]}]}',
            "request a already exists",
        ),
    ],
)
def test_bad_lines_name_the_line(line: str, message: str) -> None:
    lines = [
        json.dumps(LOG_HEADER),
        '{"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}',
        line,
    ]
    with pytest.raises(InputError) as e:
        steplog.read_jsonl(lines, "run.jsonl")
    assert e.value.details[0].startswith("run.jsonl:3")
    assert message in e.value.details[0]
    assert "nothing was loaded" in e.value.message


def test_every_bad_line_is_listed() -> None:
    lines = ["{", '{"step": 0}', "{", '{"step": 0}']
    with pytest.raises(InputError) as e:
        steplog.read_jsonl(lines, "x")
    assert [d.split(":")[1] for d in e.value.details] == ["1", "3", "4"]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"pagedkv_step_log": 3}, "unsupported step log version 3"),
        ({"pagedkv_step_log": 1, "block_size": 300}, "'block_size' must be in 1..256"),
        ({"pagedkv_step_log": 1, "block_bytes": 100}, "positive multiple of 256"),
        ({"pagedkv_step_log": 1, "gpu_base": 8}, "'gpu_base' must be a multiple of 256"),
        ({"pagedkv_step_log": 1, "colour": "red"}, "unknown header key(s) colour"),
    ],
)
def test_bad_header(header: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as e:
        steplog.read_jsonl([json.dumps(header)], "x")
    assert message in e.value.details[0]


SHARE_HASHED = {"op": "share", "req": "b", "blocks": [1], "hashes": ["00000000000000ab"]}


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"ops": [{"op": "cache", "blocks": [1], "hashes": ["00000000000000ab"]}]}, "'cache'"),
        ({"ops": [SHARE_HASHED]}, "'hashes'"),
        ({"ops": [{"op": "free", "req": "a", "handed": [1]}]}, "'handed'"),
        ({"observed": {"free_list": [1]}}, "'free_list'"),
        ({"new_requests": [{"req_id": "c", "hashes": []}]}, "'hashes'"),
    ],
)
def test_a_version_1_log_may_not_carry_the_witness_of_version_2(
    tmp_path: Path, step: dict[str, Any], message: str
) -> None:
    line = json.dumps({"step": 1, **step})
    v1 = write_log(tmp_path / "v1.jsonl", [ALLOC, line])
    assert re.search(
        f":3: .*{message}.* (is|are) format version 2, but the header says version 1",
        refused_lines(v1),
    )
    v2 = write_log(tmp_path / "v2.jsonl", [ALLOC, line], {**LOG_HEADER, "pagedkv_step_log": 2})
    assert steplog.read_log(v2).num_rows > 1


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "cache", "blocks": [1]}, "needs 'hashes', one a block"),
        ({"op": "cache", "blocks": [1], "hashes": [None]}, "hash cannot be null"),
        ({"op": "cache", "blocks": [1, 2], "hashes": ["00000000000000ab"]}, "1 hash(es) for 2"),
        ({**SHARE_HASHED, "hashes": ["ab"]}, 'a block hash of 16 hex digits, not "ab"'),
        ({**SHARE_HASHED, "hashes": [12]}, "a block hash of 16 hex digits, not 12"),
        ({"op": "free", "req": "a", "handed": [-1]}, "handed: block id -1 is negative"),
    ],
)
def test_a_malformed_witness_is_refused_naming_its_field(
    tmp_path: Path, op: dict[str, Any], message: str
) -> None:
    line = json.dumps({"step": 1, "ops": [op]})
    path = write_log(tmp_path / "w.jsonl", [ALLOC, line], {**LOG_HEADER, "pagedkv_step_log": 2})
    assert message in refused_lines(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"step":1,"ops":[{"op":"free","req":"a"}],"ops":[]}', r":3: duplicate key 'ops'"),
        ('{"step":1,"step":2}', r":3: duplicate key 'step'"),
        ('{"step":1,"ops":[{"op":"free","req":"a","req":"b"}]}', r":3: duplicate key 'req'"),
        ('{"step":1,"observed":{"ref_cnt":{"1":1,"1":2}}}', r":3: duplicate key '1'"),
    ],
)
def test_a_duplicate_key_is_refused_not_last_wins(tmp_path: Path, line: str, message: str) -> None:
    path = write_log(tmp_path / "d.jsonl", [ALLOC, line])
    assert re.search(message, refused_lines(path))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"step":1,"ops":[{"op":"free","req":"r\xfe"}]}', r":3: not UTF-8 \(byte 0xfe"),
        (b'{"step":1,"ops":[{"op":"free","req":"r\xc0\x80"}]}', r":3: not UTF-8 \(byte 0xc0"),
        (b'{"step":1,"ops":[{"op":"fr\xffee","req":"a"}]}', r":3: not UTF-8"),
        (b'{"step":1,"ops":[{"op":"free","req":"r\\ud800"}]}', r":3: .*not valid Unicode"),
    ],
)
def test_bytes_that_are_not_utf8_are_refused_never_replaced(
    tmp_path: Path, raw: bytes, message: str
) -> None:
    # r\xfe and r\xff must not both become r\ufffd (freeing one would free the other)
    path = tmp_path / "u.jsonl"
    path.write_bytes(
        (json.dumps(LOG_HEADER) + "\n" + json.dumps(ALLOC) + "\n").encode() + raw + b"\n"
    )
    assert re.search(message, refused_lines(path))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"step":' + "9" * 5000 + "}", r":3: a number has more than 4300 digits"),
        ('{"step":1,"note":' + "[" * 3000 + "]" * 3000 + "}", r":3: .*nested too deeply"),
        (
            '{"step":1,"ops":[{"op":"append","req":"a","tokens":9223372036854775807},'
            '{"op":"append","req":"a","tokens":5}]}',
            r":3: .*tokens",
        ),
        (  # 3e9 tokens on one block are refused at once, not run for minutes
            '{"step":1,"ops":[{"op":"append","req":"a","tokens":3000000000}]}',
            r":3: request a would hold 3,000,000,000 tokens, more than 256 \(the pool's 64 blocks",
        ),
    ],
)
def test_numbers_and_nesting_past_any_engine_are_one_line_each(
    tmp_path: Path, line: str, message: str
) -> None:
    path = write_log(tmp_path / "n.jsonl", [ALLOC, line])
    assert re.search(message, refused_lines(path))


def test_a_bom_and_cr_line_ends_are_read_as_fact_files_are(tmp_path: Path) -> None:
    lines = [
        json.dumps(LOG_HEADER),
        json.dumps(ALLOC),
        '{"step":1,"ops":[{"op":"free","req":"a"}]}',
    ]
    expected = steplog.read_log(write_log(tmp_path / "plain.jsonl", [ALLOC, json.loads(lines[2])]))
    for name, data in (
        ("bom.jsonl", "\ufeff" + "\n".join(lines) + "\n"),
        ("cr.jsonl", "\r".join(lines) + "\r"),
        ("crlf.jsonl", "\r\n".join(lines) + "\r\n"),
    ):
        (tmp_path / name).write_bytes(data.encode())
        assert steplog.read_log(tmp_path / name).equals(expected), name


@pytest.mark.parametrize(
    ("header", "block"),
    [
        ({"pagedkv_step_log": 1}, 2**63 - 1),  # 256-byte blocks: past 2^63 at once
        ({"pagedkv_step_log": 1, "gpu_base": 2**63 - 2**20}, 2**12),
        ({"pagedkv_step_log": 1, "block_bytes": 2**62}, 2),
    ],
)
def test_a_block_without_a_64_bit_address_is_refused_naming_it(
    tmp_path: Path, header: dict[str, Any], block: int
) -> None:
    # refused at its line, never a clean replay and then "Out of Range Error: Overflow in
    # multiplication" at --at
    step = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [block]}]}
    path = write_log(tmp_path / "o.jsonl", [step], header)
    assert re.search(rf":2: .*block {block} has no address: gpu_base", refused_lines(path))
