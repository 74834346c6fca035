"""The core commands of the CLI (load, resolve, check, violations, explain, stats, repair,
sql): exact output and exit codes, the formats they write, then the database state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from .helpers import DATA, SEED_OUTPUT, Cli, loaded, snapshot


def test_check_says_row_for_one_finding_and_rows_for_two(cli: Cli, tmp_path: Path) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    one: Any = cli("check")
    assert "unresolved_token (diag_unresolved_token), warning, 1 row:" in one.stdout
    extra = tmp_path / "more.facts"
    extra.write_text("1\t88\t5\t8\n")
    assert cli("load", str(extra), "--relation", "virtual_token", "--append").exit_code == 0  # type: ignore[attr-defined]
    two: Any = cli("check")
    assert "unresolved_token (diag_unresolved_token), warning, 2 rows:" in two.stdout


LOAD_SUMMARY = """\
relation           rows  read  duplicates  mode      source
root_table            2     2           0  replaced  {d}/root_table.facts
block_table_entry     4     4           0  replaced  {d}/block_table_entry.facts
virtual_token         8     8           0  replaced  {d}/virtual_token.facts
swapped_block         1     1           0  replaced  {d}/swapped_block.facts
loaded into pagedkv.duckdb
warning: 2 diagnostic finding(s): ref_count (diag_refcount_mismatch) 1, unresolved_token \
(diag_unresolved_token) 1; see `pagedkv-sql check`
"""


def test_load_then_resolve(cli: Cli) -> None:
    result: Any = cli("load", str(DATA))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == LOAD_SUMMARY.format(d=DATA)
    result = cli("resolve")
    assert result.exit_code == 0
    assert result.stdout == SEED_OUTPUT
    assert (cli.cwd / "pagedkv.duckdb").exists()


def test_resolve_without_a_database_is_a_clear_error(cli: Cli) -> None:
    result: Any = cli("resolve")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: no database at pagedkv.duckdb\n"
        "Fix: create it with `pagedkv-sql load SOURCE`, or pass --db / set PAGEDKV_DB\n"
    )
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def test_check_exit_codes(cli: Cli) -> None:
    cli("load", str(DATA))
    result: Any = cli("check")
    assert result.exit_code == 0
    assert result.stdout.endswith("0 error(s), 2 warning(s)\n")
    assert cli("check", "--strict").exit_code == 1


def _bad(tmp: Path, name: str, text: str) -> Path:
    d = tmp / "bad"
    d.mkdir(exist_ok=True)
    for f in DATA.glob("*.facts"):
        (d / f.name).write_text(f.read_text())
    (d / name).write_text(text)
    return d


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "block_table_entry.facts",
            "100\t0\t268435457\t2\n100\t1\t536870912\t-1\n",
            "Error: 2 row(s) of block_table_entry violate the spec's integrity constraints; "
            "nothing was loaded\n"
            "  block_table_entry(100, 0, 268435457, 2) at {d}/block_table_entry.facts:1: "
            "physical_block_base 268435457 is not 256-byte aligned (268435457 mod 256 = 1)\n"
            "  block_table_entry(100, 1, 536870912, -1) at {d}/block_table_entry.facts:2: "
            "refcount -1 is negative\n"
            "Fix: block bases must be multiples of 256, offsets in [0, 255], refcounts >= 0\n",
        ),
        (
            "virtual_token.facts",
            "1\t0\t0\t0\n1\t1\t0\t256\n",
            "Error: 1 row(s) of virtual_token violate the spec's integrity constraints; "
            "nothing was loaded\n"
            "  virtual_token(1, 1, 0, 256) at {d}/virtual_token.facts:2: "
            "offset_in_block 256 is outside [0, 255]\n"
            "Fix: block bases must be multiples of 256, offsets in [0, 255], refcounts >= 0\n",
        ),
        (
            "root_table.facts",
            "1\t1.5\n2\n",
            "Error: 2 malformed value(s) or line(s) in {d}/root_table.facts; nothing was loaded\n"
            "  {d}/root_table.facts:1:3: block_table_ptr: invalid number '1.5'; expected a "
            "signed 64-bit integer (decimal, 0x hex or 0b binary)\n"
            "  {d}/root_table.facts:2: 1 field(s), expected 2 (seq_id, block_table_ptr) "
            "separated by a tab\n"
            "Fix: fix the lines named above; numbers are decimal, 0x hex or 0b binary signed "
            "64-bit integers\n",
        ),
    ],
)
def test_refused_load_changes_nothing(
    cli: Cli, tmp_path: Path, name: str, text: str, message: str
) -> None:
    assert cli("load", str(DATA)).exit_code == 0
    before = snapshot(cli.cwd / "pagedkv.duckdb")
    bad = _bad(tmp_path, name, text)
    result: Any = cli("load", str(bad))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == message.format(d=bad)
    assert snapshot(cli.cwd / "pagedkv.duckdb") == before


def test_strict_load_refuses_warnings_and_keeps_state(cli: Cli) -> None:
    result: Any = cli("load", str(DATA), "--strict")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error: refused under --strict: 2 diagnostic finding(s) in 2 check(s); nothing was loaded\n"
    )
    assert "diag_unresolved_token" not in result.stderr or "token_pos" in result.stderr
    # the refused first load leaves no database behind (it would be an empty one)
    assert not (cli.cwd / "pagedkv.duckdb").exists()


# --max-errors is defined once (cli/common.py) with its bound, min=0: -5 is refused by every
# command that takes it (a copy without the bound listed all but the last five problems)
@pytest.mark.parametrize(
    "command",
    [["load", "x.facts"], ["import", "vllm", "x.npz"], ["replay", "x.jsonl"], ["spark", "resolve"]],
)
def test_max_errors_is_never_negative(cli: Cli, command: list[str]) -> None:
    result: Any = cli(*command, "--max-errors", "-5")
    assert result.exit_code == 2
    assert "Invalid value for '--max-errors'" in result.stderr  # the wording is typer's


def _misaligned(tmp_path: Path, n: int) -> Path:
    """A directory whose block_table_entry has n bases off the 256-byte alignment."""
    bad = tmp_path / f"misaligned{n}"
    bad.mkdir()
    rows = "".join(f"1\t{i}\t{256 * i + 1}\t1\n" for i in range(n))
    (bad / "block_table_entry.facts").write_text(rows)
    return bad


def test_max_errors_lists_that_many_rows_and_counts_the_rest(cli: Cli, tmp_path: Path) -> None:
    bad = _misaligned(tmp_path, 3)
    one: Any = cli("load", str(bad), "--max-errors", "1")
    assert one.exit_code == 1
    assert one.stderr.count("is not 256-byte aligned") == 1
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in one.stderr
    every: Any = cli("load", str(bad), "--max-errors", "0")
    assert every.exit_code == 1
    assert every.stderr.count("is not 256-byte aligned") == 3
    assert "more" not in every.stderr


def test_load_lists_a_hundred_offending_rows_by_default(cli: Cli, tmp_path: Path) -> None:
    result: Any = cli("load", str(_misaligned(tmp_path, 102)))
    assert result.exit_code == 1
    assert result.stderr.count("is not 256-byte aligned") == 100
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in result.stderr


def test_check_limit_shows_that_many_rows_and_zero_shows_all(cli: Cli, tmp_path: Path) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    extra = tmp_path / "more.facts"
    extra.write_text("1\t88\t5\t8\n1\t89\t5\t9\n")
    loaded: Any = cli("load", str(extra), "--relation", "virtual_token", "--append")
    assert loaded.exit_code == 0
    one: Any = cli("check", "--limit", "1")
    assert "unresolved_token (diag_unresolved_token), warning, 3 rows:" in one.stdout
    assert "  ... and 2 more (--limit 0 shows all)" in one.stdout
    every: Any = cli("check", "--limit", "0")
    assert "unresolved_token (diag_unresolved_token), warning, 3 rows:" in every.stdout
    assert "more (--limit 0 shows all)" not in every.stdout
    rows = [line.split()[:2] for line in every.stdout.splitlines()]
    assert ["1", "88"] in rows and ["1", "89"] in rows


def test_explain_shows_a_swapped_block_and_a_missing_entry(cli: Cli) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    swapped: Any = cli("explain", "1", "32")
    assert swapped.exit_code == 0
    assert swapped.stdout == (
        "token seq_id 1, token_pos 32\n"
        "  virtual_token      block_index 2, offset_in_block 0\n"
        "  root_table         seq_id 1 -> block table 100\n"
        "  block_table_entry  (100, 2): none\n"
        "  swapped_block      (100, 2): cpu_base_address 1879048192 (0x70000000)\n"
        "  => cpu tier: 1879048192 + 0 = 1879048192 (0x70000000)\n"
    )
    resident: Any = cli("explain", "1", "15")
    assert resident.exit_code == 0
    assert "  swapped_block      (100, 0): none\n" in resident.stdout
    assert "  => gpu tier: 268435456 + 15 = 268435471 (0x1000000f)\n" in resident.stdout


def test_errors_of_a_command_without_max_errors_list_a_hundred(cli: Cli) -> None:
    """`diff LOG` reads the log under the default of a hundred listed problems."""
    assert cli("synth", "--steps", "2", "good.jsonl").exit_code == 0  # type: ignore[attr-defined]
    header = (cli.cwd / "good.jsonl").read_text().splitlines()[0]
    (cli.cwd / "bad.jsonl").write_text(header + "\n" + '{"step": "x"}\n' * 102)
    result: Any = cli("diff", "bad.jsonl", "--from", "0", "--to", "1")
    assert result.exit_code == 1
    assert result.stderr.count("'step' must be an integer") == 100
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in result.stderr


def test_explain_and_stats_on_the_seed(cli: Cli) -> None:
    cli("load", str(DATA))
    result: Any = cli("explain", "2", "16")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == (
        "  => unresolved: block 1 of block table 101: neither resident (block_table_entry) "
        "nor swapped (swapped_block)"
    )
    result = cli("explain", "1", "31")
    assert result.exit_code == 0
    assert (
        result.stdout.splitlines()[-1] == "  => gpu tier: 536870912 + 15 = 536870927 (0x2000000f)"
    )
    result = cli("stats", "--format", "json")
    import json

    stats = json.loads(result.stdout)
    assert stats["missing_blocks"] == 1 and stats["swapped_blocks"] == 1
    assert stats["refcount_histogram"] == [
        {"refcount": 1, "physical_blocks": 3},
        {"refcount": 2, "physical_blocks": 1},
    ]


def test_check_json_and_strict(cli: Cli) -> None:
    import json

    cli("load", str(DATA))
    result: Any = cli("check", "--format", "json")
    report = json.loads(result.stdout)
    assert (report["errors"], report["warnings"]) == (0, 2)
    assert cli("load", str(DATA), "--strict").exit_code == 1


def test_stdin_text_and_arrow(cli: Cli) -> None:
    result: Any = cli("load", "-", "--relation", "root_table", input="1\t100\n2\t101\n")
    assert result.exit_code == 0, result.stderr
    sink = pa.BufferOutputStream()
    table = pa.table({"seq_id": [1], "block_table_ptr": [7]})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    result = cli(
        "load",
        "-",
        "-r",
        "root_table",
        "-f",
        "arrow",
        "--append",
        input=sink.getvalue().to_pybytes(),
    )
    assert result.exit_code == 0, result.stderr
    assert snapshot(cli.cwd / "pagedkv.duckdb")["root_table"] == [(1, 7), (1, 100), (2, 101)]


def test_explain_names_every_resident_entry_with_its_base_in_hex(cli: Cli) -> None:
    cli("load", str(DATA))
    result: Any = cli("explain", "1", "0")
    assert result.exit_code == 0, result.stderr
    assert "block_table_entry  (100, 0): base 268435456 (0x10000000), refcount 2" in result.stdout


def test_the_load_summary_names_each_relations_mode(cli: Cli, tmp_path: Path) -> None:
    only = tmp_path / "only"
    only.mkdir()
    (only / "root_table.facts").write_text((DATA / "root_table.facts").read_text())

    def table(result: Any) -> list[list[str]]:
        assert result.exit_code == 0, result.stderr
        lines = result.stderr.split("\nloaded into ")[0].splitlines()[1:]
        return [line.split()[:5] for line in lines]

    assert table(cli("load", str(DATA))) == [
        ["root_table", "2", "2", "0", "replaced"],
        ["block_table_entry", "4", "4", "0", "replaced"],
        ["virtual_token", "8", "8", "0", "replaced"],
        ["swapped_block", "1", "1", "0", "replaced"],
    ]
    assert table(cli("load", str(only))) == [
        ["root_table", "2", "2", "0", "replaced"],
        ["block_table_entry", "4", "-", "-", "kept"],
        ["virtual_token", "8", "-", "-", "kept"],
        ["swapped_block", "1", "-", "-", "kept"],
    ]
    result: Any = cli("load", str(only), "--empty-missing")
    lines = result.stderr.split("\nloaded into ")[0].splitlines()[1:]
    assert [line.split(None, 5)[5] for line in lines] == [
        str(only / "root_table.facts"),
        *["(no file: emptied)"] * 3,
    ]
    assert table(cli("load", str(only / "root_table.facts"), "--append")) == [
        ["root_table", "2", "2", "2", "appended"],
    ]
    assert table(cli("load", str(only), "--empty-missing")) == [
        ["root_table", "2", "2", "0", "replaced"],
        ["block_table_entry", "0", "-", "-", "emptied"],
        ["virtual_token", "0", "-", "-", "emptied"],
        ["swapped_block", "0", "-", "-", "emptied"],
    ]


@pytest.mark.parametrize("size", ["0", "-1", "257", "9223372036854775807", "9223372036854775808"])
def test_block_size_bounds(cli: Cli, size: str) -> None:
    loaded(cli)
    for command in (["load", str(DATA)], ["stats"], ["check"]):
        result: Any = cli(*command, "--block-size", size)
        assert result.exit_code == 2, (command, result.stderr)
        assert "Error: --block-size must be a number of tokens in [1, 256]" in result.stderr


def test_repair_of_a_database_that_is_not_there_creates_none(cli: Cli) -> None:
    # a typo in --db must not leave an empty database named like the intended one
    # (`repair` included: it opens the database, never creates it)
    result: Any = cli("repair", "--db", "typo.duckdb")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no database at typo.duckdb\nFix: ")
    assert list(cli.cwd.iterdir()) == []


def test_max_errors_must_not_be_negative(cli: Cli) -> None:
    (cli.cwd / "root_table.facts").write_text("1\tx\n2\ty\n")
    result: Any = cli("load", "root_table.facts", "--max-errors", "-1")
    assert result.exit_code == 2
    result = cli("load", "root_table.facts", "--max-errors", "0")
    assert result.stderr.count("invalid number") == 2


@pytest.mark.parametrize("text", ["1.0", "1_5", " 0", "0x", "1e3"])
def test_explain_reads_numbers_as_fact_files_do(cli: Cli, text: str) -> None:
    loaded(cli)
    result: Any = cli("explain", "1", text)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: TOKEN_POS: invalid number {text!r}")


def test_explain_takes_hex_and_negative_ids(cli: Cli) -> None:
    loaded(cli)
    result: Any = cli("explain", "0x1", "0x10")
    assert result.exit_code == 0
    assert result.stdout.startswith("token seq_id 1, token_pos 16\n")
    result = cli("explain", "-3", "0")
    assert result.exit_code == 1
    assert result.stdout.endswith(
        "=> unresolved: no virtual_token row for seq_id -3, token_pos 0\n"
    )


def test_resolve_a_kv_cache_group_of_an_engine_import(cli: Cli) -> None:
    """`resolve --group N`: the tokens a group keeps at its blocks; without it the spec's
    relations (the primary group); a group with no tokens or none at all: exit 2."""
    from .engines.helpers import grouped_snapshot

    window = {"kind": "sliding_window", "block_size": 4, "sliding_window": 8}
    full = {"kind": "full_attention", "block_size": 4}
    snap = grouped_snapshot([window, full], {"r1": [[0, 7, 5, 6], [1, 2, 3, 4]]}, {"r1": 13})
    snap.save(cli.cwd / "hybrid.npz")
    assert cli("import", "vllm", "hybrid.npz").exit_code == 0  # type: ignore[attr-defined]
    spec: Any = cli("resolve")
    assert len(spec.stdout.splitlines()) == 13
    assert spec.stdout == cli("resolve", "--group", "1").stdout  # type: ignore[attr-defined]
    group: Any = cli("resolve", "--group", "0")
    # tokens 6..12 of the window: 6, 7 in block 7 (entry 1), 8..11 in block 5, 12 in block 6
    assert group.stdout.splitlines()[:3] == ["0\t6\t1794", "0\t7\t1795", "0\t8\t1280"]
    assert len(group.stdout.splitlines()) == 7
    refused: Any = cli("resolve", "--group", "3")
    assert refused.exit_code == 2
    assert refused.stderr == "Error: no KV-cache group 3 in the imported state; groups: 0, 1\n"
    stats: Any = cli("stats")
    assert "KV-cache group 0 (sliding_window 8, block size 4) blocks held" in stats.stdout
    assert "KV-cache group 1 (full_attention, block size 4, the spec's relations)" in stats.stdout
