"""The step-log reader: vLLM-shaped steps and operations into block-level events; bad logs
refused whole with the line named."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import log as steplog

from .helpers import Cli, snapshot
from .steplogs import ALLOC, LOG_HEADER, refused_lines, write_log


def events(steps: list[Any], header: dict[str, Any] | None = LOG_HEADER) -> list[tuple[Any, ...]]:
    lines = ([json.dumps(header)] if header else []) + [json.dumps(s) for s in steps]
    table = steplog.read_jsonl(lines, "<test>")
    keep = [
        "step",
        "op",
        "request",
        "block_index",
        "block_id",
        "cpu_address",
        "token_from",
        "token_to",
    ]
    return [tuple(r[k] for k in keep) for r in table.to_pylist()]


def test_vllm_shaped_steps_become_block_events() -> None:
    got = events(
        [
            {
                "step": 0,
                "new_requests": [
                    {
                        "req_id": "a",
                        "block_ids": [[1, 2]],
                        "num_computed_tokens": 0,
                        "num_scheduled_tokens": 6,
                    }
                ],
            },
            {
                "step": 1,
                "new_requests": [
                    {
                        "req_id": "b",
                        "block_ids": [1, 3],
                        "num_computed_tokens": 4,
                        "num_scheduled_tokens": 1,
                    }
                ],
                "running": [
                    {
                        "req_id": "a",
                        "new_block_ids": [],
                        "num_computed_tokens": 6,
                        "num_scheduled_tokens": 1,
                    }
                ],
            },
            {"step": 2, "finished": ["b"]},
        ]
    )
    assert got == [
        (0, "arrive", "a", None, None, None, None, None),
        (0, "allocate", "a", 0, 1, None, None, None),
        (0, "allocate", "a", 1, 2, None, None, None),
        (0, "append", "a", None, None, None, 0, 6),
        (1, "arrive", "b", None, None, None, None, None),
        (1, "share", "b", 0, 1, None, None, None),
        (1, "allocate", "b", 1, 3, None, None, None),
        (1, "append", "b", None, None, None, 0, 5),
        (1, "append", "a", None, None, None, 6, 7),
        (2, "free", "b", 0, 1, None, None, None),
        (2, "free", "b", 1, 3, None, None, None),
        (2, "free", "b", None, None, None, None, None),
    ]


def test_vllm_columnar_cached_requests_and_resumption() -> None:
    got = events(
        [
            {
                "step": 0,
                "new_requests": [
                    {
                        "req_id": "a",
                        "block_ids": [5],
                        "num_computed_tokens": 0,
                        "num_scheduled_tokens": 3,
                    }
                ],
            },
            {
                "step": 1,
                "scheduled_cached_reqs": {
                    "req_ids": ["a"],
                    "new_block_ids": [[[6]]],
                    "num_computed_tokens": [3],
                    "resumed_from_preemption": [False],
                },
                "num_scheduled_tokens": {"a": 2},
            },
            {"step": 2, "preempted": ["a"]},
            {
                "step": 3,
                "running": [
                    {
                        "req_id": "a",
                        "new_block_ids": [7, 8],
                        "num_computed_tokens": 0,
                        "num_scheduled_tokens": 5,
                        "resumed_from_preemption": True,
                    }
                ],
            },
        ]
    )
    ops = [(s, op, i, b) for s, op, _, i, b, *_ in got]
    assert (1, "allocate", 1, 6) in ops
    assert [o for o in ops if o[0] == 2] == [
        (2, "preempt", 0, 5),
        (2, "preempt", 1, 6),
        (2, "preempt", None, None),
    ]
    assert [o for o in ops if o[0] == 3 and o[1] == "allocate"] == [
        (3, "allocate", 0, 7),
        (3, "allocate", 1, 8),
    ]


def test_operations_fork_swap_release() -> None:
    got = events(
        [
            {
                "step": 0,
                "ops": [
                    {"op": "allocate", "req": "a", "blocks": [1, 2]},
                    {"op": "append", "req": "a", "tokens": 6},
                ],
            },
            {
                "step": 1,
                "ops": [
                    {"op": "fork", "req": "b", "parent": "a"},
                    {"op": "swap_out", "req": "a", "cpu": [4096, 8192]},
                ],
            },
            {
                "step": 2,
                "ops": [
                    {"op": "swap_in", "req": "a", "blocks": [9], "indices": [1]},
                    {"op": "release", "req": "b", "blocks": [2, 2]},
                ],
            },
        ]
    )
    rows = [(s, op, r, i, b, c) for s, op, r, i, b, c, *_ in got]
    assert (1, "fork", "b", 0, 1, None) in rows and (1, "fork", "b", 1, 2, None) in rows
    assert (1, "swap_out", "a", 0, 1, 4096) in rows and (1, "swap_out", "a", 1, 2, 8192) in rows
    assert (2, "swap_in", "a", 1, 9, 8192) in rows
    # the second release finds no entry: block_index NULL, for replay to report
    assert [x for x in rows if x[1] == "release"] == [
        (2, "release", "b", 1, 2, None),
        (2, "release", "b", None, 2, None),
    ]


def test_a_refused_log_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    good = write_log(
        tmp_path / "good.jsonl",
        [
            {
                "step": 0,
                "ops": [
                    {"op": "allocate", "req": "a", "blocks": [1]},
                    {"op": "append", "req": "a", "tokens": 3},
                ],
            }
        ],
    )
    assert cli("replay", str(good), "--at", "0").exit_code == 0
    before = snapshot(cli.cwd / "pagedkv.duckdb")
    bad = write_log(tmp_path / "bad.jsonl", [{"step": 0}, "{oops"])
    result: Any = cli("replay", str(bad), "--at", "0")
    assert result.exit_code == 1
    assert "bad.jsonl:3:2: malformed JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(cli.cwd / "pagedkv.duckdb") == before
    # the stored log is still the good one
    assert "1 step(s), 3 event(s)" in cli("replay").stdout


def test_event_table_round_trip_and_validation(tmp_path: Path) -> None:
    lines = [
        json.dumps(LOG_HEADER),
        json.dumps(
            {
                "step": 0,
                "ops": [
                    {"op": "allocate", "req": "a", "blocks": [1]},
                    {"op": "append", "req": "a", "tokens": 2},
                ],
            }
        ),
    ]
    table = steplog.read_jsonl(lines, "x")
    for name in ("ev.parquet", "ev.arrow"):
        steplog.write_events(table, tmp_path / name)
        back = steplog.read_log(tmp_path / name)
        assert back.equals(table)
        assert steplog.header_of(back).block_size == 4
    rows = table.to_pylist()
    rows[1]["op"] = "teleport"
    rows[2]["step"] = -1
    bad = pa.Table.from_pylist(rows, schema=table.schema)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.replay(bad)
    details = "\n".join(e.value.details)
    assert "event 1: unknown operation 'teleport'" in details
    assert "event 2: step -1 is negative" in details
    assert "step 0 is out of order" in details
    rows = table.to_pylist()
    rows[2]["event"] = 0
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.replay(pa.Table.from_pylist(rows, schema=table.schema))
    assert e.value.details == ["event table: event 0: step 0 uses an event number twice"]
    with pytest.raises(InputError, match="missing column"):
        steplog.conform(table.drop_columns(["op"]), "x")


# -- a step log (read by its content) is refused naming the line, never half-read or crashed
# on


def test_tokens_past_the_pool_are_bounded_without_a_pool_size_too(tmp_path: Path) -> None:
    steps = [ALLOC, {"step": 1, "ops": [{"op": "append", "req": "a", "tokens": 3 * 10**9}]}]
    path = write_log(tmp_path / "p.jsonl", steps, {"pagedkv_step_log": 1, "block_size": 16})
    assert re.search(r"more than 48 \(its blocks and the 2 the log has named", refused_lines(path))
    # within the pool it is a finding (unresolved_token), not a refusal
    steps[1] = {"step": 1, "ops": [{"op": "append", "req": "a", "tokens": 20}]}
    path = write_log(tmp_path / "q.jsonl", steps, {"pagedkv_step_log": 1, "block_size": 16})
    with pagedkv_sql.connect(":memory:") as db:
        assert [f.check for f in db.replay(path).findings] == ["unresolved_token"]


@pytest.mark.parametrize("column", ["op", "event", "step"])
def test_an_event_table_with_a_null_is_refused_naming_the_row(tmp_path: Path, column: str) -> None:
    # a NULL op never replays clean; a NULL step is named, not DuckDB's NOT NULL error
    table = steplog.read_log(write_log(tmp_path / "l.jsonl", [ALLOC]))
    i = table.schema.get_field_index(column)
    field = table.schema.field(column)
    values = table.column(column).to_pylist()
    values[1] = None
    bad = table.set_column(i, field, pa.array(values, field.type))
    with pytest.raises(InputError, match=rf"row 1 has a null '{column}'"):
        steplog.conform(bad, "x.parquet")


@pytest.mark.parametrize(
    "meta", [b"[1]", b"[" * 100_000 + b"]" * 100_000, b'{"pagedkv_step_log": 1e999}']
)
def test_bad_header_metadata_in_an_event_table_is_one_error(tmp_path: Path, meta: bytes) -> None:
    import pyarrow.parquet as pq

    table = steplog.read_log(write_log(tmp_path / "l.jsonl", [ALLOC]))
    pq.write_table(
        table.replace_schema_metadata({steplog.HEADER_KEY: meta}), tmp_path / "m.parquet"
    )
    with pytest.raises(InputError, match=r"bad step-log header in the schema metadata"):
        steplog.read_log(tmp_path / "m.parquet")


def test_a_log_is_read_by_its_content_not_its_name(cli: Cli) -> None:
    # "synth --steps N DIR" (no extension) wrote Arrow which "replay DIR" read as JSON Lines
    assert cli("synth", "run", "--steps", "80").exit_code == 0
    result: Any = cli("replay", "run", "--db", "a.duckdb")
    assert result.exit_code == 0, result.stderr
    assert "no invariant broken" in result.stdout
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    table = steplog.read_log(cli.cwd / "run")
    pq.write_table(table, cli.cwd / "parquet.jsonl")
    with ipc.new_stream(str(cli.cwd / "stream.log"), table.schema) as w:
        w.write_table(table)
    (cli.cwd / "lines.parquet").write_text(json.dumps(LOG_HEADER) + "\n" + json.dumps(ALLOC) + "\n")
    for name in ("parquet.jsonl", "stream.log"):
        assert steplog.read_log(cli.cwd / name).equals(table), name
    assert steplog.read_log(cli.cwd / "lines.parquet").num_rows == 2
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(cli.cwd / "parquet.jsonl").findings == []


def test_a_fifo_is_read_as_a_stream_and_a_directory_is_named(tmp_path: Path) -> None:
    # neither is "no step log at ..."
    import os
    import threading

    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    text = json.dumps(LOG_HEADER) + "\n" + json.dumps(ALLOC) + "\n"
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    try:
        assert steplog.read_log(fifo).num_rows == 2
    finally:
        writer.join()
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(InputError, match=r"dir\.jsonl is a directory, not a step log"):
        steplog.read_log(tmp_path / "dir.jsonl")
    with pytest.raises(InputError, match=r"no step log at"):
        steplog.read_log(tmp_path / "absent.jsonl")


@pytest.mark.parametrize(
    ("log", "message"),
    [
        (123, r"log must be a path, a binary stream, an event table or a list of steps"),
        (b"x.jsonl", r"log must be a path"),
        ([{"step": 0}, 5], r"log\[1\] must be a step \(a dict\) or one JSON line"),
    ],
)
def test_replay_of_the_wrong_type_is_a_usage_error(log: Any, message: str) -> None:
    with (
        pagedkv_sql.connect(":memory:") as db,
        pytest.raises(pagedkv_sql.UsageError, match=message),
    ):
        db.replay(log)


def test_replay_takes_a_list_of_steps() -> None:
    # replay([{"step": 0}]) reads the steps, no AttributeError 'strip'
    with pagedkv_sql.connect(":memory:") as db:
        free = json.dumps({"step": 1, "ops": [{"op": "free", "req": "a"}]})
        assert db.replay([LOG_HEADER, ALLOC, free]).steps == 2
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.UsageError):
        db.apply(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["parquet", "parquet-dictionary-op", "arrow", "table"])
@pytest.mark.parametrize(
    ("header", "block"),
    [
        ({"pagedkv_step_log": 1}, 2**62),
        ({"pagedkv_step_log": 1, "gpu_base": 2**63 - 2**20}, 2**12),
        ({"pagedkv_step_log": 1, "block_bytes": 2**62}, 2),
    ],
)
def test_an_event_table_block_without_a_64_bit_address_is_refused_naming_it(
    tmp_path: Path, form: str, header: dict[str, Any], block: int
) -> None:
    # an event table gets the same refusal as a JSON line's, never a clean replay and then
    # DuckDB's "Overflow in multiplication" at --at
    import pyarrow.parquet as pq

    step = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}
    table = steplog.read_log(write_log(tmp_path / "o.jsonl", [step], {"pagedkv_step_log": 1}))
    ids = pa.array([None if b is None else block for b in table.column("block_id").to_pylist()])
    table = table.set_column(5, "block_id", ids.cast(pa.int64()))
    table = table.replace_schema_metadata({steplog.HEADER_KEY: json.dumps(header)})
    source: Any = table
    if form.startswith("parquet"):
        if form == "parquet-dictionary-op":
            table = table.set_column(2, "op", table.column("op").dictionary_encode())
        source = tmp_path / "o.parquet"
        pq.write_table(table, source)
    elif form == "arrow":
        source = tmp_path / "o.arrow"
        steplog.write_events(table, source)
    with (
        pagedkv_sql.connect(":memory:") as db,
        pytest.raises(InputError, match=rf"block {block} has no address: gpu_base"),
    ):
        db.replay(source)


def test_an_event_table_block_with_an_address_replays(tmp_path: Path) -> None:
    # the bound is the address, not a size: the highest block that still fits is replayed
    header = {"pagedkv_step_log": 1, "gpu_base": 2**63 - 2**20, "block_bytes": 256}
    block = (2**20 - 256) // 256
    step = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [block]}]}
    table = steplog.read_log(write_log(tmp_path / "o.jsonl", [step], header))
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(table).findings == []
        assert db.replay_at(0).rows["block_table_entry"] == 1


@pytest.mark.parametrize("step", ["a", None, 1.5, True, 2**70])
def test_a_step_that_is_no_integer_is_a_usage_error(step: Any) -> None:
    # replay_at("a") and diff("a", 1) are usage errors, not TypeErrors; 1.5 and True are not
    # "after the log's last step"; 2**70 is no int64 step
    with pagedkv_sql.connect(":memory:") as db:
        db.replay([LOG_HEADER, ALLOC])
        for call in (lambda: db.replay_at(step), lambda: db.diff(step, 0)):
            with pytest.raises(pagedkv_sql.UsageError, match=r"step (must be|\d+ is out)"):
                call()
        with pytest.raises(pagedkv_sql.UsageError, match="to_step"):
            db.diff(0, step)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": "x"}, r"limit must be None or a count"),
        ({"limit": -1}, r"limit must be None or a count >= 0, not -1"),
        ({"limit": 1.5}, r"limit must be None or a count"),
        ({"keep_going": "yes"}, r"keep_going must be True or False"),
    ],
)
def test_replay_options_of_the_wrong_type_are_usage_errors(
    kwargs: dict[str, Any], message: str
) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.replay([LOG_HEADER, ALLOC])
        with pytest.raises(pagedkv_sql.UsageError, match=message):
            db.replay(None, **kwargs)


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_a_compressed_log_is_read_by_its_content_from_a_path_or_stdin(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replay run.jsonl.gz` (and a .zst, and one whose name says nothing): the log
    inside, JSON Lines or an event table, read as if it were plain."""
    import gzip
    import io

    import pyarrow as pa

    from pagedkv_sql import replay
    from pagedkv_sql.replay.synth import StepSynthConfig
    from pagedkv_sql.replay.synth import write as synth_log

    def pack(data: bytes) -> bytes:
        return gzip.compress(data) if kind == "gzip" else pa.compress(data, "zstd", asbytes=True)

    synth_log(StepSynthConfig(steps=30, faults=()), tmp_path / "run.jsonl")
    synth_log(StepSynthConfig(steps=30, faults=()), tmp_path / "run.parquet")
    plain = steplog.read_log(tmp_path / "run.jsonl")
    for name in ("run.jsonl", "run.parquet"):
        packed = tmp_path / f"{name}.packed"  # no .gz: the first bytes tell
        packed.write_bytes(pack((tmp_path / name).read_bytes()))
        assert steplog.read_log(packed).equals(plain)
    stdin = io.BytesIO(pack((tmp_path / "run.jsonl").read_bytes()))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stdin))
    assert steplog.read_log("-").equals(plain)
    with pagedkv_sql.connect(":memory:") as db:
        assert replay.run(db, tmp_path / "run.jsonl.packed").ok


def test_a_truncated_compressed_log_is_refused_naming_it(tmp_path: Path) -> None:
    import gzip

    cut = gzip.compress(b'{"step": 0, "ops": []}\n' * 50)[:-9]
    (tmp_path / "run.jsonl.gz").write_bytes(cut)
    with pytest.raises(InputError, match=r"run\.jsonl\.gz: its gzip data is corrupt or truncated"):
        steplog.read_log(tmp_path / "run.jsonl.gz")
