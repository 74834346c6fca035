"""The engine commands of the CLI (import, export, explain --layer) and what they print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .helpers import DATA, Cli, snap


def test_import_lists_every_spec_relation_and_only_engine_tables_with_rows(cli: Cli) -> None:
    result: Any = cli("import", "flashinfer", str(DATA / "engines" / "flashinfer.npz"))
    assert result.exit_code == 0, result.stderr
    table = result.stderr.split("\nimported flashinfer snapshot ")[0].splitlines()
    assert [line.split() for line in table] == [
        ["table", "rows"],
        ["engine_request", "3"],
        ["engine_block_table", "7"],
        ["engine_csr_row", "3"],
        ["root_table", "3"],
        ["block_table_entry", "7"],
        ["virtual_token", "71"],
        ["swapped_block", "0"],
    ]


def test_only_the_table_of_resolve_names_the_engine_requests(cli: Cli) -> None:
    assert cli("import", "flashinfer", str(DATA / "engines" / "flashinfer.npz")).exit_code == 0  # type: ignore[attr-defined]
    table: Any = cli("resolve", "-f", "table")
    assert table.stdout.split("\n")[0].split() == [
        "seq_id",
        "request_id",
        "token_pos",
        "physical_address",
        "physical_address",
        "(hex)",
    ]
    assert table.stdout.split("\n")[1].split()[:2] == ["0", "chat-41"]
    facts: Any = cli("resolve")
    assert facts.stdout.split("\n")[0] == "0\t0\t139887085158400"
    assert cli("resolve", "-f", "csv").stdout.split("\n")[0] == (  # type: ignore[attr-defined]
        "seq_id,token_pos,physical_address"
    )


def test_explain_layer_marks_no_address_inside_the_tensor(cli: Cli) -> None:
    assert cli("import", "flashinfer", str(DATA / "engines" / "flashinfer.npz")).exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("explain", "0", "0", "--layer", "0")
    assert result.stdout.endswith(
        "  K  layer 0 head 0: paged_kv_cache block 5 slot 0 -> 0x7f3a00050000\n"
        "  V  layer 0 head 0: paged_kv_cache block 5 slot 0 -> 0x7f3a00058000\n"
    )
    import json

    with_layer: Any = cli("explain", "0", "0", "--layer", "0", "--format", "json")
    kv = json.loads(with_layer.stdout)["kv_addresses"]
    assert [(a["kv"], a["address"]) for a in kv] == [("K", 0x7F3A00050000), ("V", 0x7F3A00058000)]
    without: Any = cli("explain", "0", "0", "--format", "json")
    assert "kv_addresses" not in json.loads(without.stdout)


def test_export_runs_beside_another_reader(cli: Cli, tmp_path: Path) -> None:
    assert cli("import", "flashinfer", str(DATA / "engines" / "flashinfer.npz")).exit_code == 0  # type: ignore[attr-defined]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True);"
            " print('ready', flush=True); time.sleep(60)",
            str(cli.cwd / "pagedkv.duckdb"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        result: Any = cli("export", "flashinfer", "-o", str(tmp_path / "out"))
        assert result.exit_code == 0, result.stderr
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_cli_import_and_export(cli: object, tmp_path: Path) -> None:
    path = snap([35, 16], [[5, 7, 9], [2]], request_ids=["r1", "r2"]).save(tmp_path / "s.npz")
    r = cli("import", "flashinfer", str(path))  # type: ignore[operator]
    assert r.exit_code == 0, r.output
    assert "imported flashinfer snapshot" in r.output
    r = cli("export", "flashinfer", "--output", str(tmp_path / "out"))  # type: ignore[operator]
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "kv_indices.npy"), [5, 7, 9, 2])
    r = cli("import", "flashinfr", str(path))  # type: ignore[operator]
    assert r.exit_code == 2 and "did you mean 'flashinfer'" in r.output


# -- a plain np.savez imports ------------------------------------------------------------


PLAIN = {  # FlashInfer's own names, as a user saves what they gave plan()
    "kv_indptr": [0, 2, 3],
    "kv_indices": [4, 5, 9],
    "kv_last_page_len": [5, 16],
}


def _plain_npz(path: Path, **extra: Any) -> Path:
    import numpy as np

    arrays = {k: np.array(v, dtype=np.int32) for k, v in PLAIN.items()}
    np.savez(path, **arrays, **{k: np.array(v) for k, v in extra.items()})
    return path


def _requests(cli: Cli) -> list[str]:
    result: Any = cli("sql", "SELECT request_id, num_tokens FROM engine_request ORDER BY 1")
    assert result.exit_code == 0, result.stderr
    return result.stdout.splitlines()[1:-1]


def test_import_takes_the_page_size_of_a_plain_npz_from_its_member(cli: Cli) -> None:
    _plain_npz(cli.cwd / "fi.npz", page_size=16, kv_layout="HND")
    result: Any = cli("import", "flashinfer", "fi.npz")
    assert result.exit_code == 0, result.stderr
    # 21 tokens: one full page and 5; 16: one full page
    assert [r.split() for r in _requests(cli)] == [["0", "21"], ["1", "16"]]
    sql = "SELECT * FROM engine_info WHERE name IN ('block_size', 'kv_layout') ORDER BY 1"
    info: Any = cli("sql", sql, "-f", "csv")
    assert info.stdout.splitlines()[1:] == ["block_size,16", "kv_layout,HND"]


def test_import_page_size_and_request_ids_complete_a_file_without_them(cli: Cli) -> None:
    _plain_npz(cli.cwd / "fi.npz")
    refused: Any = cli("import", "flashinfer", "fi.npz")
    assert refused.exit_code == 1
    assert "Fix: give it: `pagedkv-sql import ENGINE PATH --page-size N`" in refused.stderr
    (cli.cwd / "ids.txt").write_text("req-a\nreq-b\n")
    result: Any = cli(
        "import", "flashinfer", "fi.npz", "--page-size", "16", "--request-ids", "ids.txt"
    )
    assert result.exit_code == 0, result.stderr
    assert [r.split() for r in _requests(cli)] == [["req-a", "21"], ["req-b", "16"]]


def test_import_refuses_a_page_size_or_ids_the_file_contradicts(cli: Cli) -> None:
    _plain_npz(cli.cwd / "fi.npz", page_size=16)
    other: Any = cli("import", "flashinfer", "fi.npz", "--page-size", "32")
    assert other.exit_code == 1
    assert "fi.npz records page_size 16, not the --page-size 32 given" in other.stderr
    (cli.cwd / "three.txt").write_text("a\nb\nc\n")
    count: Any = cli("import", "flashinfer", "fi.npz", "--request-ids", "three.txt")
    assert count.exit_code == 1 and "fi.npz: 3 request ids for 2 sequence(s)" in count.stderr
    missing: Any = cli("import", "flashinfer", "fi.npz", "--request-ids", "none.txt")
    assert missing.exit_code == 2 and "--request-ids none.txt: no such file" in missing.stderr
    # nothing was imported by any of them: no database was left behind
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def test_import_completes_engine_names_from_the_library_list() -> None:
    from pagedkv_sql.cli.engines import ENGINE_NAMES, _complete_engine
    from pagedkv_sql.engines import ENGINES

    assert tuple(ENGINES) == ENGINE_NAMES
    assert _complete_engine("fl") == ["flashinfer"]
    assert _complete_engine("") == list(ENGINES)


def test_stats_after_an_import_gives_each_pools_blocks_as_text_and_json(
    cli: Cli, tmp_path: Path
) -> None:
    from .engines.helpers import vllm_snapshot

    snap_ = vllm_snapshot()
    snap_.meta["block_hashes"] = {"6": "ab12"}
    path = snap_.save(tmp_path / "v.npz")
    assert cli("import", "vllm", str(path)).exit_code == 0  # type: ignore[attr-defined]
    text: Any = cli("stats")
    assert text.exit_code == 0, text.stderr
    assert text.stdout.splitlines()[-6:] == [
        "pool 0 (kv_cache) blocks                   8",
        "pool 0 (kv_cache) held by requests         5",
        "pool 0 (kv_cache) cached, reclaimable      1",
        "pool 0 (kv_cache) free                     1",
        "pool 0 (kv_cache) reserved                 1",
        "pool 0 (kv_cache) unaccounted              0",
    ]
    result: Any = cli("stats", "-f", "json")
    assert json.loads(result.stdout)["pools"] == [
        {
            "pool_id": 0,
            "name": "kv_cache",
            "tier": "gpu",
            "blocks": 8,
            "held": 5,
            "cached": 1,
            "free": 1,
            "reserved": 1,
            "unaccounted": 0,
        }
    ]
    # a plain load replaces the engine's state: no pool, and no "pools" key
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert "pools" not in json.loads(cli("stats", "-f", "json").stdout)  # type: ignore[attr-defined]
    assert "pool 0" not in cli("stats").stdout  # type: ignore[attr-defined]


def test_request_ids_split_at_lf_and_crlf_only(cli: Cli) -> None:
    """A form feed, NEL or U+2028 inside an id is part of it (str.splitlines cut there and
    shifted every later id onto another sequence): 2 lines are 2 ids, for 2 sequences."""
    _plain_npz(cli.cwd / "fi.npz", page_size=16)
    (cli.cwd / "ids.txt").write_bytes("chat-1\x0c\x1c\x85\u2028x\r\nchat-2\n".encode())
    result: Any = cli("import", "flashinfer", "fi.npz", "--request-ids", "ids.txt")
    assert result.exit_code == 0, result.stderr
    rows: Any = cli("sql", "SELECT request_id FROM engine_request ORDER BY seq_id", "-f", "jsonl")
    assert [json.loads(r)["request_id"] for r in rows.stdout.splitlines()] == [
        "chat-1\x0c\x1c\x85\u2028x",
        "chat-2",
    ]
    (cli.cwd / "one.txt").write_bytes("chat-1\x85chat-2\n".encode())  # one line: one id
    short: Any = cli("import", "flashinfer", "fi.npz", "--request-ids", "one.txt", "--db", "n")
    assert short.exit_code == 1
    assert short.stderr.startswith("Error: fi.npz: 1 request ids for 2 sequence(s)")
    assert not (cli.cwd / "n").exists()


def test_request_ids_are_read_within_bounds(cli: Cli) -> None:
    """/dev/zero is refused after a few KiB (it was read to the memory's end), naming the
    option and the line."""
    _plain_npz(cli.cwd / "fi.npz", page_size=16)
    zero: Any = cli("import", "flashinfer", "fi.npz", "--request-ids", "/dev/zero")
    assert zero.exit_code == 1
    assert zero.stderr.startswith(
        "Error: --request-ids /dev/zero:1: a line longer than 4,096 bytes: no request id is"
    )
    (cli.cwd / "bad.txt").write_bytes(b"ok\n\xffno\n")
    bad: Any = cli("import", "flashinfer", "fi.npz", "--request-ids", "bad.txt")
    assert bad.stderr.startswith("Error: --request-ids bad.txt:2: not UTF-8 (byte 0xff")
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def test_a_page_size_out_of_range_names_the_option_not_the_file(cli: Cli) -> None:
    _plain_npz(cli.cwd / "fi.npz")
    result: Any = cli("import", "flashinfer", "fi.npz", "--page-size", "1000000")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        "Error: --page-size must be a number of tokens in [1, 256] (the spec's offsets are "
        "below 256), not 1000000"
    )
    assert not (cli.cwd / "pagedkv.duckdb").exists()
