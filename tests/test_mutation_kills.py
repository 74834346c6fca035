"""Tests written to kill the survivors of `make mutate` (docs/mutation.md): each pins a
boundary or a branch that the rest of the suite passed through without looking."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.check import CheckReport
from pagedkv_sql.errors import InputError, Problem, UsageError, Violation
from pagedkv_sql.numbers import NumberSyntaxError, parse_number, shown
from pagedkv_sql.output import hex_or_int
from pagedkv_sql.paths import database_io_error
from pagedkv_sql.relations import INPUT_RELATIONS, arrow_schema
from pagedkv_sql.synth import MAX_ANOMALIES, MAX_TOKENS, SynthConfig, synthesize

from .conftest import DATA, Cli, arrow_table

INT64_MIN = -(2**63)


# -- numbers.py ----------------------------------------------------------------------------


def test_a_field_is_quoted_whole_up_to_forty_characters_then_cut_to_thirty_two() -> None:
    assert shown("7" * 40) == repr("7" * 40)
    assert shown("7" * 41) == repr("7" * 32) + "... (41 characters)"
    assert shown("x" * 12_345) == repr("x" * 32) + "... (12,345 characters)"


def test_an_out_of_range_number_of_forty_characters_is_named_as_written() -> None:
    text = "-" + "9" * 39
    with pytest.raises(NumberSyntaxError) as e:
        parse_number(text)
    assert str(e.value).startswith(f"number {text} is out of the signed 64-bit range")
    longer = "9" * 41
    with pytest.raises(NumberSyntaxError) as e:
        parse_number(longer)
    assert str(e.value).startswith(f"number {shown(longer)} is out of the signed")


def test_the_smallest_int64_in_binary_has_sixty_four_digits_and_loads() -> None:
    assert parse_number("-0b1" + "0" * 63) == INT64_MIN
    assert parse_number("-0b" + "0" * 100 + "1" + "0" * 63) == INT64_MIN
    with pytest.raises(NumberSyntaxError):
        parse_number("0b1" + "0" * 63)


# -- errors.py -----------------------------------------------------------------------------


def test_problems_and_violations_are_immutable_values() -> None:
    """A caller may keep the problems of a refused load in a set, or pass a violation on:
    neither can be changed under it."""
    a = Problem("f.facts", 3, 7, "invalid number")
    assert {a, Problem("f.facts", 3, 7, "invalid number")} == {a}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.line = 4  # type: ignore[misc]
    v = Violation("spec_unaligned_base", "block_table_entry", {"base": 1}, "not aligned")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.reason = "fine"  # type: ignore[misc]


# -- check.py ------------------------------------------------------------------------------


def test_request_labels_name_the_requests_of_the_ids_asked(db: pagedkv_sql.Database) -> None:
    """With a label view (an engine import makes one), each seq_id asked for gets its
    request id; no ids, no labels; without the view, none either."""
    from pagedkv_sql.check import LABEL_VIEW, request_labels

    assert request_labels(db.con, [1, 2]) == {}
    db.con.execute(
        f"CREATE VIEW {LABEL_VIEW} AS SELECT * FROM (VALUES (1::BIGINT, 'chat-a'), "
        "(2::BIGINT, 'chat-b'), (3::BIGINT, 'chat-c')) t(seq_id, request_id)"
    )
    assert request_labels(db.con, [2, 1, 2]) == {1: "chat-a", 2: "chat-b"}
    assert request_labels(db.con, []) == {}


def test_check_uses_the_stored_block_size_unless_given_one(db: pagedkv_sql.Database) -> None:
    """Token 16 at (block 0, offset 16) is wrong for the stored block size 16 and right
    for 32: the block size check() is given wins, the stored one is the default."""
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(1, 16, 0, 16)]))

    def found(report: CheckReport) -> int:
        return next(r.count for r in report.results if r.name == "diag_token_decomposition")

    assert found(db.check()) == 1
    assert found(db.check(block_size=32)) == 0
    assert found(db.check(block_size=16)) == 1


# -- synth.py ------------------------------------------------------------------------------

_SMALL = {"sequences": 2, "mean_length": 3}


@pytest.mark.parametrize(
    "change",
    [
        {"sequences": 1},
        {"mean_length": 1},
        {"block_size": 1},
        {"block_size": 256},
        {"anomalies": 0},
        {"seed": 2**63 - 1},
        {"fork_fraction": 0.0, "swap_fraction": 1.0, "missing_fraction": 1.0},
        {"fork_fraction": 1.0, "swap_fraction": 0.0, "missing_fraction": 0.0},
    ],
)
def test_synth_takes_every_parameter_at_its_bounds(change: dict[str, Any]) -> None:
    tables = synthesize(SynthConfig(**{**_SMALL, **change}))
    assert set(tables) == set(INPUT_RELATIONS)


@pytest.mark.parametrize(
    "change",
    [
        {"sequences": 0},
        {"mean_length": 0},
        {"block_size": 0},
        {"block_size": 257},
        {"anomalies": -1},
        {"anomalies": MAX_ANOMALIES + 1},
        {"seed": -1},
        {"seed": 2**63},
        {"fork_fraction": -0.01},
        {"swap_fraction": 1.01},
        {"missing_fraction": -0.01},
        {"sequences": 1, "mean_length": MAX_TOKENS + 1},
    ],
)
def test_synth_refuses_every_parameter_just_beyond_its_bounds(change: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        synthesize(SynthConfig(**{**_SMALL, **change}))


# -- output.py, inspect.sql, cli.py explain --------------------------------------------------


def test_addresses_print_in_hex_with_a_sign_only_below_zero() -> None:
    assert [hex_or_int(v) for v in (0, 255, -1)] == ["0 (0x0)", "255 (0xff)", "-1 (-0x1)"]


def test_a_table_whose_every_integer_column_holds_a_null_shows_each_null() -> None:
    """Integer columns without nulls take numpy's layout; here every column has a null,
    so none may: each null is '-'."""
    import io

    from pagedkv_sql import output

    rows = pa.table(
        {"seq_id": pa.array([None, 2], pa.int64()), "token_pos": pa.array([5, None], pa.int64())}
    )
    out = io.BytesIO()
    output.write_table(rows, "table", out)
    assert out.getvalue().decode() == (
        "seq_id  token_pos\n     -          5\n     2          -\n(2 rows)\n"
    )


def test_stats_counts_a_token_with_two_decompositions_once(db: pagedkv_sql.Database) -> None:
    """A token listed twice (two decompositions, a diagnostic) is still one token."""
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(1, 0, 0, 0), (1, 0, 1, 0)]))
    assert db.stats().counts["tokens"] == 1


def test_explain_names_every_resident_entry_with_its_base_in_hex(cli: Cli) -> None:
    cli("load", str(DATA))
    result: Any = cli("explain", "1", "0")
    assert result.exit_code == 0, result.stderr
    assert "block_table_entry  (100, 0): base 268435456 (0x10000000), refcount 2" in result.stdout


# -- datalog.py ----------------------------------------------------------------------------


def test_a_directive_may_span_lines_inside_its_parentheses(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text(
        ".decl root_table(seq_id: number,\n"
        "                 block_table_ptr: number)\n"
        "root_table(1, 100).\n"
    )
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert db.sql("SELECT * FROM root_table").fetchall() == [(1, 100)]


def test_a_fact_without_its_opening_parenthesis_is_refused_as_such(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table 1, 100).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    expected = "expected a fact such as 'root_table(1, 100).'"
    assert [p.message for p in e.value.problems] == [expected]


# -- paths.py ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    ["IO Error: No space left on device", "Disk full", "File too large (errno 27)"],
)
def test_each_spelling_of_a_full_disk_gets_the_free_space_hint(message: str) -> None:
    error = database_io_error("x.duckdb", OSError(message), "write")
    assert error.hint == "free some space (or point --db at another disk) and retry"
    assert str(database_io_error("x.duckdb", OSError("Permission denied"), "write").hint)
    assert database_io_error("x.duckdb", OSError("something else"), "write").hint == ""


# -- cli.py: reading commands open the database read-only ------------------------------------


def test_reading_commands_run_beside_another_reader(cli: Cli) -> None:
    """DuckDB lets several processes read one file but not write it while another reads
    it: every reading command must open read-only (a read-write open is refused while
    another process holds the file)."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert cli("synth", "--steps", "4", "log.jsonl").exit_code == 0  # type: ignore[attr-defined]
    assert cli("replay", "log.jsonl").exit_code == 0  # type: ignore[attr-defined]
    path = cli.cwd / "pagedkv.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True);"
            " print('ready', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        for command in (
            ["resolve"],
            ["violations"],
            ["check"],
            ["explain", "1", "0"],
            ["stats"],
            ["diff", "--from", "1", "--to", "3"],
        ):
            result: Any = cli(*command)
            assert "locked" not in result.stderr, command
            assert result.exit_code in (0, 1), (command, result.stderr)
        # the pictures need the report extra: without it they stop after opening the file
        for command in (["map", "-o", "m.svg"], ["report", "-o", "r.html"]):
            result = cli(*command)
            assert "locked" not in result.stderr, command
            assert result.exit_code == 0 or "pagedkv-sql[report]" in result.stderr, command
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_facts_after_a_rule_still_load(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table(1, 100).\nr(x) :- root_table(x, _).\nroot_table(2, 200).\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert sorted(db.sql("SELECT * FROM root_table").fetchall()) == [(1, 100), (2, 200)]


def test_an_empty_fact_is_an_arity_problem(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table().\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert e.value.problems[0].message.startswith("root_table has 2 attributes")


# -- relations.py --------------------------------------------------------------------------


def test_every_relation_schema_is_non_nullable_int64() -> None:
    for relation in (*INPUT_RELATIONS, "resolved_kv_address"):
        schema = arrow_schema(relation)
        assert all(f.type == pa.int64() and not f.nullable for f in schema), relation


def test_check_says_row_for_one_finding_and_rows_for_two(cli: Cli, tmp_path: Path) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    one: Any = cli("check")
    assert "diag_unresolved_token (warning, 1 row):" in one.stdout
    extra = tmp_path / "more.facts"
    extra.write_text("1\t88\t5\t8\n")
    assert cli("load", str(extra), "--relation", "virtual_token", "--append").exit_code == 0  # type: ignore[attr-defined]
    two: Any = cli("check")
    assert "diag_unresolved_token (warning, 2 rows):" in two.stdout


# -- cli.py: what a command prints (tests/test_cli_help.py holds every --help) -------------


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
    assert "diag_unresolved_token (warning, 3 rows):" in one.stdout
    assert "  ... and 2 more (--limit 0 shows all)" in one.stdout
    every: Any = cli("check", "--limit", "0")
    assert "diag_unresolved_token (warning, 3 rows):" in every.stdout
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


# -- database.py ---------------------------------------------------------------------------


def test_a_database_opens_writable_unless_asked(tmp_path: Path) -> None:
    from pagedkv_sql.database import Database

    with Database(tmp_path / "w.duckdb") as database:
        assert not database.read_only
        database.load(DATA)
    with Database() as memory:
        assert not memory.read_only
        memory.load(DATA)
        assert memory.resolve().read_all().num_rows == 7


def test_a_read_only_duckdb_connection_makes_a_read_only_database(tmp_path: Path) -> None:
    import duckdb

    from pagedkv_sql.database import Database

    path = tmp_path / "r.duckdb"
    with Database(path) as database:
        database.load(DATA)
    con = duckdb.connect(str(path), read_only=True)
    try:
        database = Database(con)
        assert database.read_only
        with pytest.raises(UsageError, match="is open read-only"):
            database.load(DATA)
        assert database.resolve().read_all().num_rows == 7
    finally:
        con.close()


# -- progress.py ---------------------------------------------------------------------------


def test_progress_stages_draw_each_bar_forward_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a terminal receives: a bar redrawn in place, never backwards, capped at 100%,
    finished on its own line when the next stage starts; an unmeasured stage shows time."""
    import io

    from pagedkv_sql import progress

    monkeypatch.setattr("pagedkv_sql.progress.time.monotonic", lambda: 12.0)
    out = io.StringIO()
    read = ("read and check root_table", 10.0, True)
    with progress.Stages(out) as stages:
        stages.update(None, 50.0)  # no stage yet: nothing drawn
        stages.update(read, 40.0)
        stages.update(read, 20.0)  # a new statement's lower figure: the bar stays
        stages.update(read, 55.0)
        stages.update(read, 250.0)
        stages.update(("diagnostics", 11.5, False), 30.0)
    label = "read and check root_table       "
    assert out.getvalue() == (
        f"\r{label} [{'#' * 12}{'.' * 18}]  40% 2.0s"
        f"\r{label} [{'#' * 12}{'.' * 18}]  40% 2.0s"
        f"\r{label} [{'#' * 16}{'.' * 14}]  55% 2.0s"
        f"\r{label} [{'#' * 30}] 100% 2.0s"
        f"\r{label} [{'#' * 30}] 100% 2.0s\n"
        f"\r{'diagnostics':<32} [{'.' * 30}]      0.5s"
        f"\r{'diagnostics':<32} [{'#' * 30}]      0.5s\n"
    )


def test_a_progress_bar_clears_its_line_and_an_undrawn_one_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from pagedkv_sql import progress

    monkeypatch.setattr("pagedkv_sql.progress.time.monotonic", lambda: 12.0)
    out = io.StringIO()
    with progress.Bar("x", out, start=12.0) as bar:
        bar.update(-1.0)
    assert out.getvalue() == (f"\r{'x':<32} [{'.' * 30}]   0% 0.0s" * 2) + "\r\x1b[2K"
    quiet = io.StringIO()
    progress.Bar("y", quiet).finish()
    with progress.Stages(quiet):
        pass
    assert quiet.getvalue() == ""


# -- cli.py: closed standard streams, import's summary ---------------------------------------


def test_a_closed_stdout_refuses_output_but_not_stdin(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, the descriptors that paths.reserve_standard_streams found closed: fd 1
    closed refuses `resolve` (nothing written) and leaves `load -` reading stdin; fd 0
    closed refuses `load -` alone."""
    from pagedkv_sql import paths

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    monkeypatch.setattr(paths, "CLOSED_STREAMS", {1})
    refused: Any = cli("resolve")
    assert (refused.exit_code, refused.stderr) == (
        1,
        "Error: standard output is closed; nothing was written\n"
        "Fix: redirect stdout or pass --output FILE\n",
    )
    read: Any = cli("load", "-", "-r", "swapped_block", "--append", input="101\t1\t4096\n")
    assert read.exit_code == 0, read.stderr
    monkeypatch.setattr(paths, "CLOSED_STREAMS", {0})
    unread: Any = cli("load", "-", "-r", "swapped_block", "--append", input="101\t3\t8192\n")
    assert (unread.exit_code, unread.stderr) == (2, "Error: no standard input to read\n")
    monkeypatch.setattr(paths, "CLOSED_STREAMS", set())
    resolved: Any = cli("resolve")
    assert "2\t16\t4096\n" in resolved.stdout  # the block of the first stdin load
    assert "\t8192\n" not in resolved.stdout


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


def test_no_command_prints_the_help_with_every_command(cli: Cli) -> None:
    result: Any = cli()
    assert result.exit_code == 2
    assert result.output.startswith("Usage: ")  # click writes it to stdout or stderr
    assert "\nCommands:\n" in result.output and "  resolve " in result.output


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


def _dynamo_events(tmp_path: Path) -> Path:
    """A Dynamo JSON Lines stream with three findings: a gap, an unknown removal, a hash
    used after AllBlocksCleared."""
    import json

    def ev(n: int, data: Any) -> str:
        event = {"worker_id": 7, "event": {"event_id": n, "data": data, "dp_rank": 0}}
        return json.dumps({"timestamp": n, "event": event})

    stored = {"parent_hash": None, "blocks": [{"block_hash": 1, "tokens_hash": 5}]}
    later = {"parent_hash": 1, "blocks": [{"block_hash": 3, "tokens_hash": 7}]}
    lines = [
        ev(0, {"stored": stored}),
        ev(2, {"removed": {"block_hashes": [2]}}),
        ev(3, "cleared"),
        ev(4, {"stored": later}),
    ]
    path = tmp_path / "dynamo.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_kv_events_limit_shows_that_many_findings_and_zero_all(cli: Cli, tmp_path: Path) -> None:
    path = str(_dynamo_events(tmp_path))
    every: Any = cli("kv-events", path)
    assert every.exit_code == 1
    lines = every.stdout.splitlines()
    assert lines[0] == "4 event(s): 2 stored, 1 removed, 1 cleared"
    assert [line.split(": ")[1] for line in lines[1:-1]] == [
        "sequence_gap",
        "unknown_removal",
        "after_clear",
    ]
    assert lines[-1] == "3 finding(s)"
    assert cli("kv-events", path, "--limit", "0").stdout == every.stdout  # type: ignore[attr-defined]
    one: Any = cli("kv-events", path, "--limit", "1")
    assert one.stdout.splitlines()[1:] == [
        lines[1],
        "... and 2 more (--limit 0: all)",
        "3 finding(s)",
    ]


def test_ctrl_c_in_a_query_is_recognised_as_either_exception() -> None:
    import duckdb

    from pagedkv_sql.cli import _interrupted

    assert _interrupted(duckdb.InterruptException("INTERRUPT Error: Interrupted!"))
    assert _interrupted(RuntimeError("Query interrupted"))
    assert not _interrupted(RuntimeError("Invalid Input Error: ..."))
    assert not _interrupted(ValueError("interrupted"))


def test_replay_never_writes_its_events_over_its_log(cli: Cli) -> None:
    assert cli("synth", "--steps", "5", "log.jsonl").exit_code == 0  # type: ignore[attr-defined]
    before = (cli.cwd / "log.jsonl").read_bytes()
    result: Any = cli("replay", "log.jsonl", "--events", "log.jsonl")
    assert result.exit_code == 2
    assert "refusing to write log.jsonl: it is an input of this command" in result.stderr
    assert (cli.cwd / "log.jsonl").read_bytes() == before


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


def test_db_before_the_command_beats_the_environment(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_DB", "from-env.duckdb")
    result: Any = cli("--db", "given.duckdb", "load", str(DATA))
    assert result.exit_code == 0, result.stderr
    assert (cli.cwd / "given.duckdb").exists()
    assert not (cli.cwd / "from-env.duckdb").exists()


def test_a_group_without_its_command_prints_its_help(cli: Cli) -> None:
    result: Any = cli("export")
    assert result.exit_code == 2
    assert "\nCommands:\n" in result.output and "  flashinfer " in result.output


def test_kv_events_json_is_indented_by_two(cli: Cli, tmp_path: Path) -> None:
    import json

    result: Any = cli("kv-events", str(_dynamo_events(tmp_path)), "--format", "json")
    document = json.loads(result.stdout)
    assert result.stdout == json.dumps(document, indent=2, default=str) + "\n"


def test_errors_of_a_command_without_max_errors_list_a_hundred(cli: Cli) -> None:
    """`diff LOG` reads the log under the default of a hundred listed problems."""
    assert cli("synth", "--steps", "2", "good.jsonl").exit_code == 0  # type: ignore[attr-defined]
    header = (cli.cwd / "good.jsonl").read_text().splitlines()[0]
    (cli.cwd / "bad.jsonl").write_text(header + "\n" + '{"step": "x"}\n' * 102)
    result: Any = cli("diff", "bad.jsonl", "--from", "0", "--to", "1")
    assert result.exit_code == 1
    assert result.stderr.count("'step' must be an integer") == 100
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in result.stderr


def test_db_after_the_command_beats_an_empty_one_before(cli: Cli) -> None:
    assert cli("load", str(DATA), "--db", "s.duckdb").exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("--db", "", "resolve", "--db", "s.duckdb")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("1\t0\t268435456\n")


def test_an_empty_db_before_the_command_is_refused_not_the_default_file(cli: Cli) -> None:
    """`--db ""` (an unset variable in a script) is refused wherever it is given; before
    the command it used to fall back to ./pagedkv.duckdb silently."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    for args in (["--db", "", "resolve"], ["resolve", "--db", ""]):
        result: Any = cli(*args)
        assert result.exit_code == 2, args
        assert result.stderr.startswith("Error: --db is empty (an unset variable?)\n"), args


def test_a_crash_prints_a_plain_python_traceback(tmp_path: Path) -> None:
    """A bug of ours (not bad input) ends in Python's own traceback, for the bug report:
    never typer's boxed rich one."""
    script = (
        "import sys\n"
        "import pagedkv_sql.cli as cli\n"
        "def boom(*args, **kwargs):\n"
        "    raise KeyError('boom')\n"
        "cli.Database.resolve = boom\n"
        "sys.argv = ['pagedkv-sql', '--db', ':memory:', 'resolve']\n"
        "cli.main()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "Traceback (most recent call last):\n" in run.stderr
    assert run.stderr.endswith("KeyError: 'boom'\n")
    assert "╭" not in run.stderr


# -- load.py -------------------------------------------------------------------------------


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


# -- paths.py ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["EOPNOTSUPP", "EISDIR", "EINVAL"])
def test_output_falls_back_to_a_named_temp_file_without_o_tmpfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """A file system that refuses O_TMPFILE (each way the kernel says so) still gets the
    output whole, through a named temporary file beside it, and no leftover."""
    import errno
    import os

    from pagedkv_sql import paths

    real_open = os.open

    def no_tmpfile(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    target = tmp_path / "out.tsv"
    with paths.atomic_output(target) as f:
        f.write(b"1\t2\n")
    assert target.read_bytes() == b"1\t2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]


def test_output_refused_for_another_reason_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from pagedkv_sql import paths
    from pagedkv_sql.errors import PagedKVError

    real_open = os.open

    def denied(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with (
        pytest.raises(PagedKVError, match=r"cannot write .*: Permission denied"),
        paths.atomic_output(tmp_path / "out.tsv") as f,
    ):
        f.write(b"x")
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_goes_away_is_not_an_error(tmp_path: Path) -> None:
    """`pagedkv-sql resolve | head -1`: the pipe closes under a long output; exit 0,
    nothing on stderr (the reader went away on purpose)."""
    from pagedkv_sql.synth import write

    write(synthesize(SynthConfig(sequences=40, mean_length=1000)), tmp_path / "w")
    command = [sys.executable, "-m", "pagedkv_sql", "--db", "w.duckdb"]
    assert subprocess.run([*command, "load", "w", "-q"], cwd=tmp_path).returncode == 0
    proc = subprocess.Popen(
        [*command, "resolve"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().count(b"\t") == 2
    proc.stdout.close()  # `head -1` is done
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert (proc.wait(), stderr) == (0, b"")


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


def test_report_json_is_one_document_indented_by_two(cli: Cli) -> None:
    import json

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    for command in (["check"], ["stats"], ["explain", "1", "0"]):
        result: Any = cli(*command, "--format", "json")
        assert result.stdout == json.dumps(json.loads(result.stdout), indent=2) + "\n", command


def test_report_limit_zero_asks_for_every_row_and_n_for_n(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --limit 0` means all rows (None to build_report), any other N that many;
    the size of a page written to a file is said in MiB. The page itself needs plotly (the
    report tier): here build_report is replaced by a recorder, which only sees what the
    command asks of it."""
    from pagedkv_sql.report import api

    asked: list[int | None] = []
    page = "<html>" + " " * (3 * 2**19 - 13) + "</html>"  # 1.5 MiB

    def build_report(database: object, *, limit: int | None, timeline: object) -> str:
        asked.append(limit)
        return page

    monkeypatch.setattr(api, "build_report", build_report)
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    for given in ("0", "7"):
        result: Any = cli("report", "--limit", given, "-o", "-")
        assert result.exit_code == 0 and result.stdout == page, result.stderr
        assert result.stderr == ""  # nothing was written to a file
    assert asked == [None, 7]
    result = cli("report", "-o", "page.html")
    assert result.stderr == "wrote page.html: 1.5 MB\n"
    assert (cli.cwd / "page.html").read_text() == page


def test_map_says_what_it_wrote_to_a_file_only(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picture needs matplotlib (the report tier): here draw_map is a recorder."""
    from types import SimpleNamespace

    from pagedkv_sql.report import api

    def draw_map(database: object, fmt: str) -> object:
        return SimpleNamespace(content=b"<svg/>", summary=f"a {fmt} map")

    monkeypatch.setattr(api, "draw_map", draw_map)
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    shown: Any = cli("map", "-f", "svg", "-o", "-")
    assert shown.stdout == "<svg/>" and shown.stderr == ""
    written: Any = cli("map", "-o", "m.svg")
    assert written.stderr == "wrote m.svg: a svg map\n"
    assert (cli.cwd / "m.svg").read_bytes() == b"<svg/>"


def test_replay_limit_shows_that_many_findings_and_zero_all(cli: Cli) -> None:
    planted = ["--fault", "double_free@3", "--fault", "unaligned_cpu_address@6"]
    made: Any = cli("synth", "--steps", "12", *planted, "--fault", "evict_held@9", "f.jsonl")
    assert made.exit_code == 0, made.stderr
    one: Any = cli("replay", "f.jsonl", "--keep-going", "--limit", "1")
    assert one.exit_code == 1
    lines = one.stdout.splitlines()
    assert lines[2].split()[:2] == ["3", "double_free"]
    assert lines[3].startswith("... and ") and lines[3].endswith(" more (--limit 0 shows all)")
    every: Any = cli("replay", "f.jsonl", "--keep-going", "--limit", "0")
    assert "more (--limit 0 shows all)" not in every.stdout
    steps = [line.split()[0] for line in every.stdout.splitlines()[2:-1]]
    assert steps[0] == "3" and {"6", "9"} <= set(steps)


def test_ctrl_c_in_a_query_exits_130_with_nothing_changed(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duckdb

    from pagedkv_sql.database import Database

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(Database, "resolve", interrupted)
    result: Any = cli("resolve")
    assert (result.exit_code, result.stderr) == (130, "Error: interrupted; nothing was changed\n")


# -- dbutil.py, clihelp.py -----------------------------------------------------------------


def test_a_stored_block_size_is_read_within_one_to_256(tmp_path: Path) -> None:
    """A file whose settings table lost its CHECK (an older file, the DuckDB shell): the
    bounds are those of the spec's offsets, both ends included."""
    import duckdb

    from pagedkv_sql.errors import DatabaseError

    path = tmp_path / "b.duckdb"
    with pagedkv_sql.connect(path) as database:
        database.load(DATA)
    con = duckdb.connect(str(path))
    con.execute("CREATE OR REPLACE TABLE pagedkv_settings AS SELECT * FROM pagedkv_settings")
    con.close()
    for value, ok in ((0, False), (1, True), (256, True), (257, False)):
        con = duckdb.connect(str(path))
        con.execute("UPDATE pagedkv_settings SET value = ? WHERE name = 'block_size'", [value])
        con.close()
        with pagedkv_sql.connect(path, read_only=True) as database:
            if ok:
                assert database.stats().counts["tokens"] == 8, value
            else:
                with pytest.raises(DatabaseError, match=f"block_size is {value}, not a number"):
                    database.stats()


def test_plain_help_lists_the_options_after_a_hidden_one() -> None:
    import typer
    from typer.testing import CliRunner

    from pagedkv_sql.clihelp import PlainTyper

    app = PlainTyper(rich_markup_mode=None)

    @app.command()
    def run(
        secret: int = typer.Option(0, "--secret", hidden=True),
        shown: int = typer.Option(3, "--shown", help="Shown."),
    ) -> None:
        """Run."""

    @app.command()
    def other() -> None:
        """Other."""

    result: Any = CliRunner().invoke(app, ["run", "--help"])
    assert "--shown INTEGER" in result.stdout and "Shown.  [default: 3]" in result.stdout
    assert "--secret" not in result.stdout


# -- check.py: capabilities' own checks, limits, the key proof -------------------------------


def _probe_checks(db: pagedkv_sql.Database) -> dict[str, int]:
    return {r.name: r.count for r in db.check().results if r.name.startswith("diag_probe_")}


def test_a_capabilitys_check_runs_only_while_one_of_its_tables_has_rows(
    db: pagedkv_sql.Database,
) -> None:
    """A capability NAME keeps its facts in tables NAME_* and adds checks diag_NAME_*
    (an engine import: engine_*, diag_engine_*). Its checks run while any of its tables
    has a row, and not when all are empty; a table named just NAME is not one of them."""
    db.con.execute("CREATE TABLE probe_facts (seq_id BIGINT)")
    db.con.execute("CREATE TABLE probe_more (seq_id BIGINT)")
    db.con.execute("CREATE TABLE probe (seq_id BIGINT)")
    db.con.execute("INSERT INTO probe VALUES (7)")
    db.con.execute(
        "CREATE VIEW diag_probe_always AS SELECT 1::BIGINT AS seq_id, 'always' AS reason"
    )
    assert _probe_checks(db) == {}  # probe_facts and probe_more are empty
    for table in ("probe_facts", "probe_more"):  # either one's row is enough
        db.con.execute(f"INSERT INTO {table} VALUES (1)")
        assert _probe_checks(db) == {"diag_probe_always": 1}, table
        db.con.execute(f"DELETE FROM {table}")
    assert _probe_checks(db) == {}
    # a check of a capability without tables of its own always runs
    db.con.execute("CREATE VIEW diag_lone_always AS SELECT 'always' AS reason")
    assert "diag_lone_always" in {r.name for r in db.check().results}


def test_every_spec_check_names_the_relation_it_checks() -> None:
    """A spec check is run on the staged rows of its relation at load; one that named no
    relation would never run there."""
    from pagedkv_sql.check import all_checks

    checks = all_checks.__wrapped__()  # not the cached list: read constraints.sql now
    spec = {c.name: c.relation for c in checks if c.severity == "error"}
    assert spec == {
        "spec_unaligned_base": "block_table_entry",
        "spec_offset_out_of_block": "virtual_token",
        "spec_negative_refcount": "block_table_entry",
    }
    assert all(c.relation is None for c in checks if c.severity == "warning")


def test_check_limit_zero_counts_every_finding_and_lists_none(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    report = db.check(limit=0)
    assert (report.errors, report.warnings) == (0, 2)
    assert all(r.rows.num_rows == 0 for r in report.results)
    assert {r.name for r in report.results if r.count} == {
        "diag_refcount_mismatch",
        "diag_unresolved_token",
    }


def test_check_limit_caps_the_rows_not_the_count(db: pagedkv_sql.Database) -> None:
    """Three tokens in no block: a limit of 2 lists two, no limit lists all three."""
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(9, i, 0, i) for i in range(3)]))

    def lost(report: CheckReport) -> tuple[int, int]:
        r = next(r for r in report.results if r.name == "diag_unresolved_token")
        return r.count, r.rows.num_rows

    assert lost(db.check(limit=2)) == (3, 2)
    assert lost(db.check(limit=None)) == (3, 3)
    assert lost(db.check()) == (3, 3)


def test_strict_refusal_lists_a_hundred_findings_of_a_check_and_counts_all() -> None:
    """Under --strict the diagnostics refuse the load; the error names the first hundred
    rows of each check (the rest are counted)."""
    tokens = arrow_table("virtual_token", [(9, i, i // 16, i % 16) for i in range(101)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.ConstraintError) as e:
        db.load_arrow("virtual_token", tokens, strict=True)
    assert e.value.total == 101
    assert len(e.value.violations) == 100


def test_a_block_key_held_twice_is_found_whatever_the_scan_order(
    db: pagedkv_sql.Database,
) -> None:
    """Block (100, 0) at two GPU bases: keys that are not unique are never passed off as
    proven unique (which would skip the grouping that finds them); unique keys in
    ascending order still find a block both resident and swapped."""
    db.load_arrow(
        "block_table_entry",
        arrow_table("block_table_entry", [(100, 0, 256, 1), (100, 0, 512, 1), (100, 1, 768, 1)]),
    )

    def conflicts() -> list[str]:
        r = next(r for r in db.check().results if r.name == "diag_conflicting_location")
        return [row["reason"] for row in r.rows.to_pylist()]

    assert conflicts() == ["2 different GPU bases"]
    db.load_arrow("block_table_entry", arrow_table("block_table_entry", [(100, 0, 256, 1)]))
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(100, 0, 4096)]))
    assert conflicts() == ["resident and swapped at once"]


# -- datalog.py: comments and dots ------------------------------------------------------------


def test_a_comment_inside_a_directive_line_does_not_end_it(tmp_path: Path) -> None:
    """A /* comment */ on one line is blank space: the directive around it goes on to the
    end of the line (only a comment spanning lines ends it, as a newline would)."""
    f = tmp_path / "facts.dl"
    f.write_text(
        '.input root_table /* from a file */ (IO=file, filename="r.facts")\n'
        "root_table(1, 100).\n"
        ".decl x(a: number) /* one\n"
        "two */ root_table(2, 200).\n"
    )
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert sorted(db.sql("SELECT * FROM root_table").fetchall()) == [(1, 100), (2, 200)]


def test_a_dot_inside_a_facts_parentheses_does_not_end_the_fact(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table(1., 100).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [p.message for p in e.value.problems] == ["fact argument '1.' is not a number literal"]


def test_a_fact_must_start_with_a_relation_name() -> None:
    from pagedkv_sql import datalog

    facts = datalog.parse_facts('1(2, 3).\n"root_table"(1, 100).\n', "x.dl")
    expected = "expected a fact such as 'root_table(1, 100).'"
    assert [str(p) for p in facts.problems] == [f"x.dl:1:1: {expected}", f"x.dl:2:1: {expected}"]


def test_a_last_clause_without_its_dot_is_named_where_it_starts() -> None:
    from pagedkv_sql import datalog

    facts = datalog.parse_facts("root_table(1, 100).\n  root_table(2, 200)\n", "x.dl")
    assert [str(p) for p in facts.problems] == ["x.dl:2:3: clause does not end with '.'"]
    assert facts.rows == {"root_table": [(1, 100)]}
    facts = datalog.parse_facts("root_table\n", "x.dl")
    assert [str(p) for p in facts.problems] == ["x.dl:1:1: clause does not end with '.'"]


# -- synth.py: what it writes -----------------------------------------------------------------


def test_synth_csv_has_the_bare_header_every_csv_has(tmp_path: Path) -> None:
    """docs/decisions.md: csv means a bare header line everywhere (as resolve writes it);
    synth wrote it quoted ("seq_id","block_table_ptr")."""
    from pagedkv_sql.synth import write

    tables = synthesize(SynthConfig(sequences=2, mean_length=3))
    write(tables, tmp_path, "csv")
    assert (tmp_path / "root_table.csv").read_text().splitlines() == [
        "seq_id,block_table_ptr",
        "0,100",
        "1,101",
    ]


def test_synth_swapped_blocks_take_consecutive_cpu_slots_from_the_cpu_base() -> None:
    """The CPU tier is a pool of 256-byte slots numbered up from CPU_BASE (plus 2^44 with
    wide addresses), one a swapped block, as an engine's swap space numbers its blocks."""
    from pagedkv_sql.synth import CPU_BASE

    for wide in (False, True):
        config = SynthConfig(sequences=20, mean_length=40, swap_fraction=0.3, wide_addresses=wide)
        cpu = synthesize(config)["swapped_block"].column("cpu_base_address").to_pylist()
        first = CPU_BASE + (1 << 44 if wide else 0)
        assert len(cpu) > 10
        assert sorted(cpu) == [first + 256 * i for i in range(len(cpu))]


def test_synth_resident_blocks_take_consecutive_gpu_slots_from_the_gpu_base() -> None:
    from pagedkv_sql.synth import GPU_BASE

    config = SynthConfig(sequences=20, mean_length=40, fork_fraction=0, swap_fraction=0)
    bases = synthesize(config)["block_table_entry"].column("physical_block_base").to_pylist()
    assert sorted(bases) == [GPU_BASE + 256 * i for i in range(len(bases))]


def test_synth_takes_exactly_the_most_anomalies_it_allows() -> None:
    """MAX_ANOMALIES passes that check and the config is refused by the next one (the
    seed), so nothing is built; one more is refused for the anomalies."""
    at_bound = SynthConfig(sequences=1, mean_length=1, anomalies=MAX_ANOMALIES, seed=-1)
    with pytest.raises(UsageError, match="seed must be within"):
        synthesize(at_bound)
    with pytest.raises(UsageError, match="anomalies must be within"):
        synthesize(dataclasses.replace(at_bound, anomalies=MAX_ANOMALIES + 1))


def test_synth_creates_the_directories_it_writes_into(tmp_path: Path) -> None:
    from pagedkv_sql.synth import write

    out = tmp_path / "runs" / "seed-0"
    written = write(synthesize(SynthConfig(sequences=2, mean_length=3)), out)
    assert [p.name for p in written] == [f"{r}.facts" for r in INPUT_RELATIONS]
    assert all(p.parent == out and p.is_file() for p in written)


def test_synth_refuses_one_token_more_than_it_builds_and_takes_exactly_as_many() -> None:
    """sequences x mean length may be MAX_TOKENS, not one more: a config at the bound passes
    that check and is refused by the next one (so nothing is built)."""
    at_bound = SynthConfig(sequences=1, mean_length=MAX_TOKENS, anomalies=-1)
    with pytest.raises(UsageError, match="anomalies must be within"):
        synthesize(at_bound)
    with pytest.raises(UsageError, match="more than 100,000,000 tokens"):
        synthesize(dataclasses.replace(at_bound, mean_length=MAX_TOKENS + 1))


def test_a_report_may_be_written_to_a_file_named_none(cli: Cli) -> None:
    """Without --log the report has no input to protect: even an output named None (what
    str(None) spells) is not refused as one."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("report", "-o", "None")
    assert "refusing" not in result.stderr
    assert result.exit_code == 0 or "pagedkv-sql[report]" in result.stderr


def test_report_refuses_to_write_over_its_step_log(cli: Cli) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert cli("synth", "--steps", "4", "run.jsonl").exit_code == 0  # type: ignore[attr-defined]
    before = (cli.cwd / "run.jsonl").read_bytes()
    result: Any = cli("report", "-o", "run.jsonl", "--log", "run.jsonl")
    assert result.exit_code == 2
    assert "refusing to write run.jsonl: it is an input of this command" in result.stderr
    assert (cli.cwd / "run.jsonl").read_bytes() == before


def test_map_takes_its_format_from_the_output_extension_before_drawing(cli: Cli) -> None:
    """`map -o map.gif` is refused by its extension (no drawing library needed for that)."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("map", "-o", "map.gif")
    assert result.exit_code == 2
    assert "cannot draw a map as 'gif'" in result.stderr
    assert not (cli.cwd / "map.gif").exists()
    for args in (["-o", "map.gif", "--format", "png"], ["-o", "-"]):  # --format wins; - is png
        result = cli("map", *args)
        assert "cannot draw" not in result.stderr, args
        assert result.exit_code == 0 or "pagedkv-sql[report]" in result.stderr, args


# -- output.py: the text table ---------------------------------------------------------------


def _table_text(*batches: pa.RecordBatch, schema: pa.Schema | None = None) -> str:
    import io

    from pagedkv_sql.output import write_batches

    schema = schema or batches[0].schema
    out = io.BytesIO()
    write_batches(pa.RecordBatchReader.from_batches(schema, list(batches)), "table", out)
    return out.getvalue().decode()


def test_a_plain_table_right_aligns_numbers_only_and_fits_its_widest_cell() -> None:
    from pagedkv_sql.output import text_table

    assert text_table(["name", "n", "ok"], [["a", 1, True], ["bbbbbb", 12345, None]]) == (
        "name    n      ok\na           1  True\nbbbbbb  12345  -"
    )
    for ragged in ([1, 2], []):  # a row must have a cell for every column
        with pytest.raises(ValueError):
            text_table(["a"], [ragged])


def test_a_table_column_is_as_wide_as_its_widest_cell_or_header() -> None:
    """An all-null integer column is one '-' wide, a string or list column as wide as its
    longest cell; lists print as DuckDB prints them, a null as '-'."""
    t = pa.table(
        {
            "n": pa.array([None, None], pa.int64()),
            "s": ["abcdef", None],
            "l": [[1, 2], None],
            "b": [True, None],
            "f": [1.5, None],
            "d": [5, 7],
        }
    )
    assert _table_text(*t.to_batches()) == (
        "n       s       l     b    f  d\n"
        "-  abcdef  [1, 2]  True  1.5  5\n"
        "-       -       -     -    -  7\n"
        "(2 rows)\n"
    )


_BETWEEN = {
    "table": "seq_id\n     1\n     2\n(2 rows)\n",
    "json": '[\n\t{"seq_id":1},\n\t{"seq_id":2}\n]\n',
    "jsonl": '{"seq_id":1}\n{"seq_id":2}\n',
    "csv": "seq_id\n1\n2\n",
    "facts": "1\n2\n",
}


@pytest.mark.parametrize("fmt", ["table", "json", "jsonl", "csv", "facts", "arrow", "parquet"])
def test_an_empty_batch_between_two_is_skipped_and_the_rows_counted(fmt: str) -> None:
    import io

    import pyarrow.parquet as pq

    from pagedkv_sql.output import write_batches

    schema = pa.schema([("seq_id", pa.int64())])
    batches = [pa.record_batch([pa.array(v, pa.int64())], schema=schema) for v in ([1], [], [2])]
    out = io.BytesIO()
    assert write_batches(pa.RecordBatchReader.from_batches(schema, batches), fmt, out) == 2
    if fmt == "arrow":
        assert pa.ipc.open_file(out.getvalue()).read_all().column(0).to_pylist() == [1, 2]
    elif fmt == "parquet":
        assert pq.read_table(io.BytesIO(out.getvalue())).column(0).to_pylist() == [1, 2]
    else:
        assert out.getvalue().decode() == _BETWEEN[fmt]


def test_mixed_csv_and_json_rows_are_counted_and_an_integer_null_is_null() -> None:
    import io

    from pagedkv_sql.output import write_batches

    t = pa.table({"n": pa.array([None, 3], pa.int64()), "s": ["a,b", None]})
    out = io.BytesIO()
    assert (
        write_batches(pa.RecordBatchReader.from_batches(t.schema, t.to_batches()), "csv", out) == 2
    )
    assert out.getvalue().decode() == 'n,s\n,"a,b"\n3,\n'
    out = io.BytesIO()
    assert (
        write_batches(pa.RecordBatchReader.from_batches(t.schema, t.to_batches()), "jsonl", out)
        == 2
    )
    assert out.getvalue().decode() == '{"n":null,"s":"a,b"}\n{"n":3,"s":null}\n'


def test_a_number_exactly_as_wide_as_its_column_keeps_its_top_digit() -> None:
    t = pa.table({"n": pa.array([1000, 7, -100], pa.int64())})
    assert _table_text(*t.to_batches()) == "   n\n1000\n   7\n-100\n(3 rows)\n"


def test_a_sliced_string_array_writes_only_its_own_characters() -> None:
    import io

    from pagedkv_sql.output import _write_strings

    out = io.BytesIO()
    _write_strings(pa.array(["ab", "cd", "ef"]).slice(1, 1), out)
    assert out.getvalue() == b"cd"
    out = io.BytesIO()
    _write_strings(pa.chunked_array([["ab"], ["cd,\n"]]), out, cut=2)
    assert out.getvalue() == b"abcd"


@pytest.mark.parametrize("base", [10, 16])
def test_the_digit_tables_built_afresh_print_every_triple_as_python_does(
    base: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table layout reads digits three at a time from a table built once a process
    (output._TRIPLES): built afresh here, every value of one, two and three digits, and
    some longer ones, print as str() and hex() print them."""
    from pagedkv_sql import output

    monkeypatch.setattr(output, "_TRIPLES", {})
    name = "physical_address" if base == 16 else "token_pos"
    values = [*range(-(base**3), base**3 + 1), 2**63 - 1, -(2**63), base**4 + 5]
    t = pa.table({name: pa.array(values, pa.int64())})
    lines = _table_text(*t.to_batches()).splitlines()[1:-1]
    column = -1 if base == 16 else 0
    expected = [f"-0x{-v:x}" if v < 0 else f"0x{v:x}" for v in values] if base == 16 else values
    assert [line.split()[column] for line in lines] == [str(v) for v in expected]


def test_a_table_of_integer_columns_with_nulls_shows_each_null_as_a_dash() -> None:
    """Only integer columns without nulls take the all-numpy layout; nulls go the mixed way."""
    t = pa.table(
        {
            "seq_id": pa.array([1, None], pa.int64()),
            "physical_address": pa.array([None, 4096], pa.int64()),
        }
    )
    # the first batch's address column is all null: its hex column has no value to size
    assert _table_text(*t.to_batches(max_chunksize=1)) == (
        "seq_id  physical_address  physical_address (hex)\n"
        "     1                 -                       -\n"
        "     -              4096                  0x1000\n"
        "(2 rows)\n"
    )


# -- inspect.py ----------------------------------------------------------------------------


def test_explain_and_stats_give_immutable_values(db: pagedkv_sql.Database) -> None:
    """What explain() and stats() return can be kept and compared: nothing in it can be
    changed under the caller, and a resolution can go in a set."""
    db.load(DATA)
    e = db.explain(1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.broken = "somewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.hops[0].block_index = 1  # type: ignore[misc]
    r = e.resolutions[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.base = 0  # type: ignore[misc]
    assert {r, dataclasses.replace(r)} == {r}
    s = db.stats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.counts = {}  # type: ignore[misc]


def test_a_table_counts_one_row_and_no_rows_in_words() -> None:
    schema = pa.schema([("seq_id", pa.int64())])
    one = pa.record_batch([pa.array([5], pa.int64())], schema=schema)
    assert _table_text(one).endswith("\n(1 row)\n")
    assert _table_text(schema=schema) == "seq_id\n(0 rows)\n"


# -- what the modules define when imported: checked in a fresh interpreter -----------------

_DEFINITIONS = """
import dataclasses, inspect
from typer.testing import CliRunner
from pagedkv_sql import cli, errors, inspect as explained, synth

def frozen(value, name):
    try:
        setattr(value, name, None)
    except dataclasses.FrozenInstanceError:
        return True
    return False

assert frozen(errors.Problem("f.facts", 1, 1, "bad"), "line")
assert frozen(errors.Violation("spec_x", "root_table", {}, "why"), "reason")
assert frozen(explained.Hop(100, 0, 0, [], []), "block_index")
assert frozen(explained.Resolution("gpu", 256, 0, 256), "base")
assert frozen(explained.Explanation(1, 0, [], [], []), "broken")
assert frozen(explained.Stats({}, []), "counts")
config = synth.SynthConfig()
assert frozen(config, "seed") and hash(config) == hash(synth.SynthConfig())
options = inspect.signature(cli.synth).parameters
for f in dataclasses.fields(synth.SynthConfig):
    assert options[f.name].default.default == getattr(config, f.name), f.name
assert errors.UsageError("x").exit_code == 2 and errors.PagedKVError("x").exit_code == 1
assert CliRunner().invoke(cli.app, ["stats", "--db", ""]).exit_code == 2
"""


def test_result_types_are_frozen_and_synths_defaults_are_the_commands() -> None:
    """What the modules define at import, checked in a fresh interpreter (so that `make
    mutate`'s coverage map sees this test run the class definitions): explain's, stats'
    and the errors' value types are immutable, SynthConfig() is `pagedkv-sql synth`'s
    defaults, a usage error exits 2."""
    done = subprocess.run(
        [sys.executable, "-c", _DEFINITIONS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


# -- sql/constraints.sql, resolve.sql, inspect.sql: the views as a user queries them --------


def _findings(db: pagedkv_sql.Database, name: str) -> list[dict[str, Any]]:
    result = next(r for r in db.check().results if r.name == name)
    return result.rows.drop_columns(["reason"]).to_pylist()


def test_diag_refcount_mismatch_counts_a_slot_listed_twice_as_one_holder(
    db: pagedkv_sql.Database,
) -> None:
    """Slot (100, 0) lists base 256 twice, with refcounts 1 and 2: one holder."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 100)]))
    db.load_arrow(
        "block_table_entry", arrow_table("block_table_entry", [(100, 0, 256, 1), (100, 0, 256, 2)])
    )
    assert _findings(db, "diag_refcount_mismatch") == [
        {"physical_block_base": 256, "holders": 1, "refcounts": [1, 2], "held_by": "100:0"}
    ]


def test_diag_conflicting_location_finds_a_swapped_block_at_two_cpu_addresses(
    db: pagedkv_sql.Database,
) -> None:
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(101, 0, 4096), (101, 0, 8192)]))
    r = next(r for r in db.check().results if r.name == "diag_conflicting_location")
    assert [row["reason"] for row in r.rows.to_pylist()] == ["2 different CPU addresses"]


def test_diag_token_decomposition_names_only_the_wrong_token_of_a_sequence(
    db: pagedkv_sql.Database,
) -> None:
    db.load_arrow(
        "virtual_token",
        arrow_table("virtual_token", [(1, 0, 0, 0), (1, 1, 0, 1), (1, 17, 0, 17)]),
    )
    assert _findings(db, "diag_token_decomposition") == [
        {"seq_id": 1, "token_pos": 17, "block_index": 0, "offset_in_block": 17}
    ]


def test_the_token_decomposition_view_reads_the_stored_block_size(tmp_path: Path) -> None:
    """Token 16 at (0, 16) is right for block size 32: the view (what the DuckDB shell
    queries) takes the stored setting, not 16."""
    f = tmp_path / "virtual_token.facts"
    f.write_text("1\t16\t0\t16\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f, block_size=32)
        assert db.sql("SELECT count(*) FROM diag_token_decomposition").fetchall() == [(0,)]


def test_diag_overlapping_blocks_on_the_cpu_tier(db: pagedkv_sql.Database) -> None:
    """Addresses 256 bytes apart do not overlap, 128 apart do; a tier whose every address
    is a multiple of 128 but not all of 256 is still searched."""
    db.load_arrow(
        "swapped_block", arrow_table("swapped_block", [(100, 0, 100), (100, 1, 356), (100, 2, 612)])
    )
    assert _findings(db, "diag_overlapping_blocks") == []
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(100, 0, 128), (100, 1, 256)]))
    assert _findings(db, "diag_overlapping_blocks") == [
        {"tier": "cpu", "lower_address": 128, "upper_address": 256}
    ]


def test_diag_orphan_block_table_counts_each_block_once(db: pagedkv_sql.Database) -> None:
    db.load_arrow(
        "block_table_entry", arrow_table("block_table_entry", [(500, 0, 256, 1), (500, 0, 512, 1)])
    )
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(500, 1, 4096), (500, 1, 8192)]))
    assert _findings(db, "diag_orphan_block_table") == [
        {"block_table_id": 500, "resident_blocks": 1, "swapped_blocks": 1}
    ]


def test_a_negative_refcount_listed_twice_is_one_offending_row() -> None:
    rows = arrow_table("block_table_entry", [(100, 0, 256, -1), (100, 0, 256, -1)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.ConstraintError) as e:
        db.load_arrow("block_table_entry", rows)
    assert e.value.total == 1 and len(e.value.violations) == 1


def test_the_resolved_view_is_a_set_across_both_tiers(db: pagedkv_sql.Database) -> None:
    """A block resident and swapped at the same address gives its token one row."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 100)]))
    db.load_arrow("block_table_entry", arrow_table("block_table_entry", [(100, 0, 4096, 1)]))
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(100, 0, 4096)]))
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(1, 5, 0, 5)]))
    assert db.sql("SELECT * FROM resolved_kv_address").fetchall() == [(1, 5, 4101)]


def test_stats_count_missing_swapped_and_resident_blocks_apart(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    counts = db.stats().counts
    assert (counts["resident_blocks"], counts["swapped_blocks"], counts["missing_blocks"]) == (
        4,
        1,
        1,
    )


def test_a_token_inserted_twice_in_the_shell_is_one_finding(db: pagedkv_sql.Database) -> None:
    """The relations are sets: a row a DuckDB shell user inserted twice is one token, with
    one decomposition, not two."""
    db.con.execute("INSERT INTO virtual_token VALUES (1, 17, 0, 17), (1, 17, 0, 17)")
    r = next(r for r in db.check().results if r.name == "diag_token_decomposition")
    assert [row["reason"] for row in r.rows.to_pylist()] == ["offset_in_block 17 >= block size 16"]
