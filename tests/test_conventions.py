"""Behave like the tools users know: DuckDB's Python API, click's CLI habits, the formats
of DuckDB and sqlite-utils. Exact output where there is one."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import FunctionType
from typing import Any, get_args

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql import DatabaseError, QueryError, UsageError
from pagedkv_sql.cli.core import InputFormatChoice

from .helpers import DATA, SEED_OUTPUT, Cli, arrow_table

# -- Python API ----------------------------------------------------------------------


def test_connect_without_arguments_is_in_memory(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PAGEDKV_DB", str(tmp_path / "env.duckdb"))
    with pagedkv_sql.connect() as db:
        assert db.path == ":memory:"
        db.load(DATA)
    assert list(tmp_path.iterdir()) == []


def test_read_only_memory_is_refused() -> None:
    with pytest.raises(UsageError, match="in-memory database cannot be opened read-only"):
        pagedkv_sql.connect(":memory:", read_only=True)


def test_read_only_file_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(path) as db:
        db.load(DATA)
    with pagedkv_sql.connect(path, read_only=True) as db:
        assert db.read_only
        with pytest.raises(UsageError, match="open read-only"):
            db.load(DATA)
        assert db.resolve_table().num_rows == 7


def test_an_existing_connection_is_used_and_left_open() -> None:
    con = duckdb.connect()
    with pagedkv_sql.connect(con) as db:
        db.load(DATA)
    assert con.execute("SELECT count(*) FROM resolved_kv_address").fetchall() == [(7,)]
    con.close()


def test_duckdb_config_is_passed_on(tmp_path: Path) -> None:
    config = {"threads": 1, "memory_limit": "512MB"}
    with pagedkv_sql.connect(tmp_path / "c.duckdb", config=config) as db:
        got = db.sql(
            "SELECT current_setting('threads'), current_setting('memory_limit')"
        ).fetchall()
    assert got[0][0] == 1
    assert got[0][1].startswith("488")  # DuckDB reports 512MB in MiB
    with pytest.raises(UsageError, match="bad DuckDB config"):
        pagedkv_sql.connect(":memory:", config={"threads": "many"})


def test_sql_and_relation_are_lazy_duckdb_relations(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    relation = db.sql("SELECT * FROM root_table ORDER BY ALL")
    assert isinstance(relation, duckdb.DuckDBPyRelation)
    assert relation.fetchall() == [(1, 100), (2, 101)]
    assert relation.pl().shape == (2, 2)
    out = db.relation("resolved_kv_address")
    assert out.to_arrow_table().num_rows == 7
    assert out.filter("seq_id = 2").fetchall() == [(2, 0, 805306368), (2, 32, 1073741824)]
    # a relation from the same database loads without a ResourceInUse error
    copy = pagedkv_sql.connect()
    copy.load_arrow("root_table", db.sql("SELECT * FROM root_table"))
    assert copy.sql("SELECT count(*) FROM root_table").fetchall() == [(2,)]


def test_one_exception_rule_with_duckdbs_error_chained(db: pagedkv_sql.Database) -> None:
    with pytest.raises(QueryError, match="SQL error: Catalog Error") as info:
        db.sql("SELECT * FROM nowhere")
    assert isinstance(info.value.__cause__, duckdb.CatalogException)
    assert isinstance(info.value, pagedkv_sql.PagedKVError)
    db.con.execute("DROP VIEW spec_unaligned_base")  # a database broken from outside
    with pytest.raises(DatabaseError, match="check: Catalog Error") as broken:
        db.check()
    assert isinstance(broken.value.__cause__, duckdb.Error)
    db.con.execute("DROP MACRO TABLE pagedkv_spec_unaligned_base")
    db.con.execute("DROP TABLE pagedkv_settings")
    with pytest.raises(DatabaseError):
        db.stats()


def test_resolve_stream_returns_a_record_batch_reader(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    tokens = db.reader("virtual_token").read_all()
    reader = db.resolve_stream(tokens.to_batches(max_chunksize=3))
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema == pagedkv_sql.arrow_schema("resolved_kv_address")
    assert reader.read_all().num_rows == 7


def test_four_threads_share_one_database(tmp_path: Path) -> None:
    db = pagedkv_sql.connect(tmp_path / "t.duckdb")
    db.load(DATA)
    errors: list[BaseException] = []
    results: list[tuple[int, int, int, list[int]]] = []
    barrier = threading.Barrier(4)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(10):
                report = db.check()
                stats = db.stats()
                resolved = db.resolve_table()
                explained = db.explain(1, 32)
                results.append(
                    (
                        report.warnings,
                        stats.counts["tokens"],
                        resolved.num_rows,
                        explained.addresses,
                    )
                )
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    db.close()
    assert errors == []
    assert results == [(2, 8, 7, [1879048192])] * 40


def _writable_elsewhere(path: Path) -> str:
    """Open ``path`` for writing in another process: refused while this process still
    holds the file open (DuckDB's lock), on every DuckDB version."""
    code = f"import duckdb; duckdb.connect({str(path)!r}).close(); print('free')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def test_close_ends_the_streams_left_unread(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    with pagedkv_sql.connect(path) as db:
        db.load(DATA)
    db = pagedkv_sql.connect(path, read_only=True)
    tokens = db.reader("virtual_token").read_all()
    unread = [db.resolve(), db.reader("block_table_entry")]
    started = db.resolve_stream(tokens.to_batches(max_chunksize=3))
    started.read_next_batch()
    db.close()
    assert _writable_elsewhere(path) == "free"
    # and a second open in this process does not wait for the first (DuckDB 1.5.0 did)
    with pagedkv_sql.connect(path, read_only=True) as again:
        assert again.resolve_table().num_rows == 7
    del unread, started


def test_a_refused_command_leaves_the_database_closed(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    result: Any = cli("resolve", "-o", "pagedkv.duckdb")
    assert result.exit_code == 2
    assert _writable_elsewhere(cli.cwd / "pagedkv.duckdb") == "free"
    assert cli("resolve").stdout == SEED_OUTPUT


def test_mixed_line_ends_take_the_fast_reader_and_say_so(
    db: pagedkv_sql.Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "root_table.facts"
    path.write_bytes(b"1\t100\r\n2\t0x65\r3\t102\n\n")
    with caplog.at_level(logging.INFO, logger="pagedkv_sql"):
        db.load(path)
    assert db.sql("SELECT * FROM root_table ORDER BY ALL").fetchall() == [
        (1, 100),
        (2, 101),
        (3, 102),
    ]
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("pagedkv_sql.sources", f"{path}: CR line ends; reading it with pyarrow's CSV reader")
    ]


def test_input_format_names_agree() -> None:
    assert tuple(f.value for f in InputFormatChoice) == get_args(pagedkv_sql.InputFormat)


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for name in pagedkv_sql.__all__:
        obj = getattr(pagedkv_sql, name)
        if isinstance(obj, (type, FunctionType)) and not (obj.__doc__ or "").strip():
            missing.append(name)
        if isinstance(obj, type):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and callable(value) and not value.__doc__:
                    missing.append(f"{name}.{attr}")
    assert missing == []


# -- CLI -----------------------------------------------------------------------------


def test_version(cli: Cli) -> None:
    result: Any = cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"pagedkv-sql {pagedkv_sql.__version__}\n"


def test_db_before_the_subcommand(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("--db", "a.duckdb", "load", str(DATA), "--quiet").exit_code == 0
    assert (cli.cwd / "a.duckdb").exists()
    assert cli("--db", "a.duckdb", "resolve").stdout == SEED_OUTPUT
    monkeypatch.setenv("PAGEDKV_DB", "nowhere.duckdb")
    assert cli("--db", "a.duckdb", "resolve").stdout == SEED_OUTPUT
    assert cli("--db", "nowhere.duckdb", "resolve", "--db", "a.duckdb").stdout == SEED_OUTPUT


def test_help_lists_choices_env_var_and_no_type_tags(cli: Cli) -> None:
    result: Any = cli("resolve", "--help")
    text = " ".join(result.stdout.split())
    assert "facts|tsv|csv|json|jsonl|ndjson|table|text|arrow|arrows|parquet" in text
    assert "[env var: PAGEDKV_DB]" in text
    assert "<str>" not in text and "list[" not in text


EXPLAIN_HELP = """\
Usage: pagedkv-sql explain [OPTIONS] SEQ_ID TOKEN_POS

  Show how one token resolves: root -> block table -> entry or swapped block ->
  tier -> address, or exactly where that breaks (then exit 1). Tabular formats
  write one row a way it resolves.

Arguments:
  SEQ_ID     A number as in fact files (0x10, -5: negatives need no --).
             [required]
  TOKEN_POS  [required]

Options:
  --db PATH                       Database file (default: pagedkv.duckdb here);
                                  ':memory:' works.  [env var: PAGEDKV_DB]
  --layer N                       Also show the byte addresses of the token's K
                                  and V for this layer (needs an engine import
                                  with cache tensors).
  --head N                        The KV head for --layer.  [default: 0]
  -f, --format [text|table|json|jsonl|ndjson|csv|tsv|arrow|arrows|parquet]
                                  text (default; alias table), json (one
                                  document), or the rows as jsonl, csv, tsv,
                                  arrow, arrows or parquet (default: from the
                                  --output extension, else text).
  -o, --output FILE               Write to FILE instead of stdout ('-': stdout);
                                  its extension picks the format when --format
                                  is not given (.txt for people), and .gz or
                                  .zst after it compresses.
  -h, --help                      Show this message and exit.
"""


def test_help_is_plain_click_help_on_every_typer(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact text: arguments bare (no ``<str>``, no ``{SEQ_ID}``), brackets unescaped;
    the same under typer 0.16 (make test-min) and the newest (make test-new)."""
    result: Any = cli("explain", "--help")
    assert result.stdout == EXPLAIN_HELP
    replay: Any = cli("replay", "--help")
    assert "Usage: pagedkv-sql replay [OPTIONS] [LOG]\n" in replay.stdout
    assert "  [LOG]  Step log:" in replay.stdout
    assert "  --at STEP " in replay.stdout
    assert "  -f, --format [text|table|json|jsonl|ndjson|csv|tsv|arrow|arrows|parquet]\n" in (
        replay.stdout
    )
    load: Any = cli("load", "--help")
    assert "Usage: pagedkv-sql load [OPTIONS] SOURCE...\n" in load.stdout
    assert "  --diagnostics / --no-diagnostics\n" in load.stdout


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in getattr(group, "commands", {}).items():
        found += _commands(command, (*path, name))
    return found


def test_no_command_shows_type_tags(cli: Cli) -> None:
    import typer

    from pagedkv_sql.cli import app

    for path in _commands(typer.main.get_command(app)):
        text: str = cli(*path, "--help").stdout  # type: ignore[attr-defined]
        usage = text.splitlines()[0]
        assert usage.startswith("Usage: pagedkv-sql"), (path, text)
        assert "{" not in usage and "<" not in usage, (path, usage)
        assert not re.search(r" <[a-z][^>]*>", text), (path, text)
        assert "\\[" not in text and " TEXT " not in text, (path, text)


def test_usage_errors_are_plain_lines(cli: Cli) -> None:
    result: Any = cli("resolve", "--format", "xml")
    assert result.exit_code == 2
    assert "╭" not in result.stderr and "│" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("Error: Invalid value for '--format'")
    assert "'xml' is not one of 'facts', 'tsv', 'csv', 'json'" in result.stderr


def test_quiet_load_prints_nothing(cli: Cli) -> None:
    result: Any = cli("load", str(DATA), "--quiet")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_output_dash_is_stdout_and_extension_picks_the_format(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    result: Any = cli("resolve", "-o", "-")
    assert result.stdout == SEED_OUTPUT
    assert not (cli.cwd / "-").exists()
    assert cli("resolve", "-o", "out.csv").exit_code == 0
    assert (cli.cwd / "out.csv").read_text().splitlines()[0] == "seq_id,token_pos,physical_address"
    assert cli("resolve", "-o", "out.arrow").exit_code == 0
    assert ipc.open_file(str(cli.cwd / "out.arrow")).read_all().num_rows == 7


@pytest.mark.parametrize(
    ("fmt", "ext"),
    [
        ("arrow", ".arrow"),
        ("arrow", ".feather"),
        ("arrows", ".arrows"),
        ("arrows", ".arrow"),  # a stream under the file extension loads too
        ("arrow", ".arrows"),
        ("parquet", ".parquet"),
        ("tsv", ".tsv"),
        ("csv", ".csv"),
        ("facts", ".facts"),
    ],
)
def test_what_we_write_we_load(cli: Cli, fmt: str, ext: str) -> None:
    """Our own round trip: a relation written in each output format loads back."""
    from pagedkv_sql import output

    with pagedkv_sql.connect() as db:
        db.load(DATA)
        table = db.reader("virtual_token").read_all()
    with (cli.cwd / f"virtual_token{ext}").open("wb") as f:
        output.write_table(table, fmt, f)
    result: Any = cli("load", f"virtual_token{ext}", "-q", "--no-diagnostics")
    assert result.exit_code == 0, result.stderr
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        assert db.reader("virtual_token").read_all().equals(table)


def test_check_stats_explain_write_files_and_tables(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    assert cli("check", "-o", "check.json").exit_code == 0
    report = json.loads((cli.cwd / "check.json").read_text())
    assert (report["errors"], report["warnings"]) == (0, 2)
    assert cli("check", "-o", "check.parquet").exit_code == 0
    summary = pq.read_table(cli.cwd / "check.parquet")
    assert summary.column_names == ["check", "severity", "found", "description"]
    assert sum(summary.column("found").to_pylist()) == 2
    assert cli("stats", "-f", "csv", "-o", "stats.csv").exit_code == 0
    lines = (cli.cwd / "stats.csv").read_text().splitlines()
    assert lines[:3] == ["metric,value", "sequences,2", "tokens,8"]
    result: Any = cli("stats", "-f", "json")
    assert json.loads(result.stdout)["tokens"] == 8
    result = cli("explain", "1", "32", "-f", "jsonl")
    assert result.stdout == (
        '{"seq_id":1,"token_pos":32,"tier":"cpu","base":1879048192,'
        '"offset_in_block":0,"physical_address":1879048192}\n'
    )
    result = cli("explain", "2", "16", "-f", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["broken"].startswith("block 1 of block table 101")


def test_violations_export(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    result: Any = cli("violations", "-f", "csv")
    assert result.exit_code == 0
    assert result.stdout == (
        "check,severity,row,reason,invariant,model,request_ids,block_ids\n"
        'diag_refcount_mismatch,warning,"{""physical_block_base"": 268435456, ""holders"": 1, '
        '""refcounts"": [2], ""held_by"": ""100:0""}",refcount 2 but 1 holder(s),ref_count,spec,'
        "[],[1048576]\n"
        'diag_unresolved_token,warning,"{""seq_id"": 2, ""token_pos"": 16, ""block_index"": 1, '
        '""offset_in_block"": 0}",block 1 of block table 101 is neither resident nor swapped,'
        "unresolved_token,spec,[],[]\n"
    )
    assert cli("violations", "-o", "v.parquet").exit_code == 0
    assert pq.read_table(cli.cwd / "v.parquet").num_rows == 2


def test_tsv_means_a_header_everywhere(cli: Cli, tmp_path: Path) -> None:
    assert (
        cli("synth", str(tmp_path / "s"), "-s", "3", "--mean-length", "5", "-f", "tsv").exit_code
        == 0
    )
    first = (tmp_path / "s" / "root_table.tsv").read_text().splitlines()[0]
    assert first == "seq_id\tblock_table_ptr"
    assert cli("load", str(tmp_path / "s"), "-q").exit_code == 0
    out: Any = cli("resolve", "-f", "tsv")
    assert out.stdout.splitlines()[0] == "seq_id\ttoken_pos\tphysical_address"


def test_arrow_table_helper_matches(db: pagedkv_sql.Database) -> None:
    db.load_arrow("root_table", arrow_table("root_table", [(1, 100)]))
    assert db.sql("SELECT * FROM root_table").fetchall() == [(1, 100)]


_DEFINITIONS = """
import dataclasses, inspect
from typer.testing import CliRunner
from pagedkv_sql import cli, errors, inspect as explained, synth
from pagedkv_sql.cli import core

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
options = inspect.signature(core.synth).parameters
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
