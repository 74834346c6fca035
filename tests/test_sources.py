"""sources/: discovery (the files of a directory, stdin, special files), the paths taken
literally, and what discovery refuses."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql import sources
from pagedkv_sql.errors import InputError, PagedKVError

from .helpers import DATA, SEED, SEED_OUTPUT, Cli, loaded, snapshot, state, write_facts


@pytest.mark.parametrize(
    "names, listed",
    [
        (["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"], "a.txt, b.txt, c.txt, d.txt, e.txt)"),
        (
            ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt", "f.txt"],
            "a.txt, b.txt, c.txt, d.txt, e.txt, ...)",
        ),
    ],
)
def test_a_directory_without_facts_lists_five_of_its_files(
    tmp_path: Path, names: list[str], listed: str
) -> None:
    for name in names:
        (tmp_path / name).write_text("1\t100\n")
    with pytest.raises(InputError) as e:
        sources.discover([str(tmp_path)])
    assert f"no facts in this directory (found only: {listed}; nothing was loaded" in str(e.value)


@pytest.mark.parametrize(
    "args, options, error, message",
    [
        ([], {}, "UsageError", "no SOURCE given; name a directory, fact files, or - for stdin"),
        (
            ["DIR/sub"],
            {"relation": "root_table"},
            "UsageError",
            "--relation names the relation of one file, not a directory",
        ),
        (
            ["DIR/root_table.xyz"],
            {},
            "UsageError",
            "DIR/root_table.xyz: unknown extension '.xyz'; use --format "
            "(facts, tsv, csv, parquet, arrow, arrows, dl)",
        ),
        (
            ["DIR/roottable.facts"],
            {},
            "InputError",
            "DIR/roottable.facts: 'roottable' is not a relation name (did you mean 'root_table'?)",
        ),
        (
            ["DIR/noext"],
            {"fmt": "json"},
            "UsageError",
            "unknown format 'json'; formats are: facts, tsv, csv, parquet, arrow, arrows, dl",
        ),
        (
            ["-"],
            {"fmt": "parquet", "relation": "root_table", "stdin": b"x"},
            "InputError",
            "<stdin>: not a readable Parquet file (",
        ),
        (
            ["-"],
            {"fmt": "arrow", "relation": "root_table", "stdin": b"x"},
            "InputError",
            "<stdin>: not an Arrow IPC stream (",
        ),
        (
            ["DIR/bad/root_table.parquet"],
            {},
            "InputError",
            "DIR/bad/root_table.parquet: not a readable Parquet file (",
        ),
        (
            ["DIR/bad/root_table.arrow"],
            {},
            "InputError",
            "DIR/bad/root_table.arrow: not a readable Arrow IPC file or stream (",
        ),
        (
            ["DIR/sub", "DIR/sub/root_table.facts"],
            {},
            "InputError",
            "two sources for root_table in one load: DIR/sub/root_table.facts and "
            "DIR/sub/root_table.facts",
        ),
    ],
)
def test_discovery_refuses_with_a_message_that_says_what(
    tmp_path: Path, args: list[str], options: dict[str, Any], error: str, message: str
) -> None:
    import io

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "root_table.facts").write_text("1\t100\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "root_table.parquet").write_bytes(b"not parquet")
    (tmp_path / "bad" / "root_table.arrow").write_bytes(b"not arrow")
    for name in ("root_table.xyz", "roottable.facts", "noext"):
        (tmp_path / name).write_text("1\t100\n")
    if "stdin" in options:
        options = {**options, "stdin": io.BytesIO(options["stdin"])}
    with pytest.raises(PagedKVError) as e:
        sources.discover([a.replace("DIR", str(tmp_path)) for a in args], **options)
    assert type(e.value).__name__ == error
    assert str(e.value).startswith(message.replace("DIR", str(tmp_path)))


def test_duckdb_s_own_error_is_named_by_its_first_line() -> None:
    ours = duckdb.Error("Invalid Input Error: pagedkv: column x holds a null\nLINE 1: ...")
    theirs = duckdb.Error("Conversion Error: bad\nLINE 1: SELECT ...")
    assert sources.problem_from_duckdb("f", ours).message == "column x holds a null"
    assert sources.problem_from_duckdb("f", theirs).message == "Conversion Error: bad"
    assert sources.problem_from_duckdb("f", duckdb.Error("one line")).message == "one line"


def test_a_regular_file_is_read_in_place_and_a_fifo_through_a_spool(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (regular,) = sources.discover([str(f)], None, None, None).sources
    assert regular.spools == [] and getattr(regular, "path", None) == f
    regular.close()
    writer = subprocess.Popen(["sh", "-c", f"printf '2\\t200\\n' > {fifo}"])
    (piped,) = sources.discover([str(fifo)], "facts", "root_table", None).sources
    writer.wait()
    assert len(piped.spools) == 1 and piped.spools[0].path.read_bytes() == b"2\t200\n"
    piped.close()


def test_an_empty_directory_lists_the_extensions_of_the_relation_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(InputError) as e:
        sources.discover([str(tmp_path)], None, None, None)
    assert e.value.hint == (
        "name each file after its relation (root_table.facts, block_table_entry.csv, ...; "
        "extensions .facts .tsv .csv .parquet .arrow .feather .arrows, each optionally .gz or "
        ".zst) or give .dl files"
    )


@pytest.mark.parametrize("fmt", ["facts", "csv", "tsv", "parquet", "arrow", "arrows", "dl"])
def test_every_format_loads_the_same_state(fmt: str, tmp_path: Path) -> None:
    directory = write_facts(tmp_path / fmt, SEED, fmt)
    with pagedkv_sql.connect(":memory:") as db:
        db.load(directory)
        assert state(db) == {r: sorted(v) for r, v in SEED.items()}
        assert (
            "".join("\t".join(map(str, r.values())) + "\n" for r in db.resolve_table().to_pylist())
            == SEED_OUTPUT
        )


@pytest.mark.parametrize(
    ("content", "fmt", "plain"),
    [
        (b"1\t-2\n+3\t004\n", "facts", True),
        (b"seq_id\tblock_table_ptr\n1\t2\n", "tsv", True),
        (b"seq_id,block_table_ptr\n1,2\n", "csv", True),
        (b"1,2\n", "facts", False),
        (b"1\t0x2\n", "facts", False),
        (b"1\t2.0\n", "facts", False),
        (b"1\t2\r\n", "facts", False),
        (b'seq_id,block_table_ptr\n"1",2\n', "csv", False),
        (b"1\t2\n" * 2_000_000 + b"1\t2 \n", "facts", False),  # past the first chunk
    ],
)
def test_only_plain_files_take_the_typed_reader(
    tmp_path: Path, content: bytes, fmt: str, plain: bool
) -> None:
    """DuckDB's typed reader is lenient (`1.5` -> 2): it is used only for files where no
    lenient spelling can occur (BAD_LINES checks the errors of both readers)."""
    from pagedkv_sql.sources import TEXT_FORMATS, only_plain_decimals

    f = tmp_path / f"root_table.{fmt}"
    f.write_bytes(content)
    delimiter, header, _ = TEXT_FORMATS[fmt]
    assert only_plain_decimals(f, delimiter, header) is plain


def test_directory_rules(tmp_path: Path, facts_dir: Callable[..., Path]) -> None:
    d = facts_dir({"root_table": [(1, 2)]})
    (d / "README.md").write_text("ignored")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        report = db.load(d)
        assert [(r.relation, r.mode, r.rows_total) for r in report.relations] == [
            ("root_table", "replaced", 1),
            ("block_table_entry", "kept", 4),
            ("virtual_token", "kept", 8),
            ("swapped_block", "kept", 1),
        ]
        report = db.load(d, empty_missing=True)
        assert [(r.relation, r.mode, r.rows_total) for r in report.relations] == [
            ("root_table", "replaced", 1),
            ("block_table_entry", "emptied", 0),
            ("virtual_token", "emptied", 0),
            ("swapped_block", "emptied", 0),
        ]
        (d / "root_tables.facts").write_text("1\t2\n")
        with pytest.raises(
            InputError,
            match=r"'root_tables' is not a relation name \(did you mean 'root_table'\?\)",
        ):
            db.load(d)
        (d / "root_tables.facts").unlink()
        (d / "root_table.csv").write_text("seq_id,block_table_ptr\n1,2\n")
        with pytest.raises(InputError, match="two sources for root_table in one load"):
            db.load(d)


def test_paths_with_spaces_quotes_and_unicode(tmp_path: Path) -> None:
    d = write_facts(tmp_path / "it's a dïr", SEED)
    with pagedkv_sql.connect(tmp_path / "db ü's.duckdb") as db:
        db.load(d)
        assert len(db.resolve_table()) == 7


def test_an_unreadable_file_says_why_and_a_broken_link_where_it_points(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    denied = sources._unreadable("f", PermissionError(13, "Permission denied"), f)
    assert (str(denied), denied.hint) == (
        "f: cannot read it: Permission denied",
        "make it (and the directories above it) readable by this user",
    )
    link = tmp_path / "gone.facts"
    link.symlink_to(tmp_path / "nowhere.facts")
    broken = sources._unreadable("g", FileNotFoundError(2, "No such file"), link)
    assert str(broken) == f"g: a broken symbolic link (to {tmp_path / 'nowhere.facts'})"
    missing = sources._unreadable("h", FileNotFoundError(2, "No such file"), tmp_path / "none")
    assert str(missing) == "h: no such file or directory"


def test_load_of_a_directory_without_facts_is_an_error(cli: Cli) -> None:
    path = loaded(cli)
    before = snapshot(path)
    cases = {
        "empty": [],
        "txt": ["notes.txt", "root_table.txt"],
    }
    for name, files in cases.items():
        d = cli.cwd / name
        d.mkdir()
        for f in files:
            (d / f).write_text("1\t2\n")
        result: Any = cli("load", name)
        assert result.exit_code == 1
        found = " (found only: notes.txt, root_table.txt)" if files else ""
        assert result.stderr.splitlines()[0] == (
            f"Error: {name}: no facts in this directory{found}; nothing was loaded"
        )
    (cli.cwd / "dangling").mkdir()
    (cli.cwd / "dangling" / "root_table.facts").symlink_to(cli.cwd / "nowhere")
    result = cli("load", "dangling")
    assert result.stderr == (
        f"Error: dangling/root_table.facts: a broken symbolic link (to {cli.cwd / 'nowhere'})\n"
    )
    (cli.cwd / "subdir" / "root_table.facts").mkdir(parents=True)
    result = cli("load", "subdir")
    assert result.stderr == (
        "Error: subdir/root_table.facts: a directory where a fact file was expected\n"
    )
    assert snapshot(path) == before


GLOBBY = ["a[12]", "a*", "a?", "{a,b}", "~", "~x", "a b", "a'b", 'a"b', "[!x]", "a,b", "é"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(GLOBBY) | st.text(st.sampled_from("ab[]*?{},~ '!-"), min_size=1),
    fmt=st.sampled_from(["facts", "csv", "tsv", "parquet", "arrow", "dl"]),
)
def test_the_path_given_is_the_file_read(tmp_path: Path, name: str, fmt: str) -> None:
    """Decoys beside the file would be read if the name were expanded as a glob."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    for decoy in ("a1", "a2", "ab", "b", "x", "a", "aa"):
        (work / f"{decoy}.{fmt}").write_text("garbage\n")
    target = work / f"{name}.{fmt}"
    table = pa.table({"seq_id": [5], "block_table_ptr": [500]})
    if fmt == "parquet":
        pq.write_table(table, target)
    elif fmt == "arrow":
        with ipc.new_file(target, table.schema) as w:
            w.write_table(table)
    elif fmt == "dl":
        target.write_text("root_table(5, 500).\n")
    elif fmt == "facts":
        target.write_text("5\t500\n")
    else:
        sep = "," if fmt == "csv" else "\t"
        target.write_text(f"seq_id{sep}block_table_ptr\n5{sep}500\n")
    # A private temporary directory: the copies a load makes of such names go there, and
    # none may stay (a shared /tmp would see other processes' copies and leftovers).
    scratch = Path(tempfile.mkdtemp(dir=tmp_path))
    cwd, saved = os.getcwd(), tempfile.tempdir
    os.chdir(work)
    tempfile.tempdir = str(scratch)
    try:
        with pagedkv_sql.connect(":memory:") as db:
            extra = {} if fmt == "dl" else {"relation": "root_table"}
            db.load(target.name, diagnostics=False, **extra)
            assert db.sql("SELECT * FROM root_table").to_arrow_table().to_pylist() == [
                {"seq_id": 5, "block_table_ptr": 500}
            ]
    finally:
        os.chdir(cwd)
        tempfile.tempdir = saved
    assert not list(scratch.iterdir())


def test_special_files_are_read_not_reported_missing(cli: Cli) -> None:
    fifo = cli.cwd / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"printf '1\\t100\\n' > {fifo}"])
    result: Any = cli("load", "fifo", "-f", "facts", "-r", "root_table", "--db", "f.duckdb")
    writer.wait()
    assert result.exit_code == 0, result.stderr
    assert snapshot(cli.cwd / "f.duckdb")["root_table"] == [(1, 100)]
    result = cli("load", "/dev/null", "-f", "facts", "-r", "root_table", "--db", "f.duckdb")
    assert result.exit_code == 0
    assert snapshot(cli.cwd / "f.duckdb")["root_table"] == []


def test_a_file_that_reports_size_zero_is_read_whole(tmp_path: Path) -> None:
    """/proc files say st_size 0 and have content: every byte is read (and here refused)."""
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load("/proc/self/status", format="facts", relation="root_table")
    assert e.value.problems[0].message.startswith("seq_id: invalid number 'Name:'")


# -- compressed input, and input told by its first bytes --------------------------------------


def _rows(cli: Cli) -> dict[str, list[tuple[int, ...]]]:
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        return state(db)


def _packed(kind: str, data: bytes) -> bytes:
    import gzip

    return gzip.compress(data) if kind == "gzip" else pa.compress(data, "zstd", asbytes=True)


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_compressed_files_load_by_name_and_by_content(cli: Cli, kind: str) -> None:
    """`load vt.facts.gz`, a directory of .zst files, and a gzip file without .gz in its
    name: each read as DuckDB reads compressed CSV, the relation named by the name less
    its compression suffix."""
    suffix = ".gz" if kind == "gzip" else ".zst"
    packed = cli.cwd / "packed"
    packed.mkdir()
    for f in DATA.glob("*.facts"):
        (packed / (f.name + suffix)).write_bytes(_packed(kind, f.read_bytes()))
    assert cli("load", "packed").exit_code == 0
    assert cli("resolve").stdout == SEED_OUTPUT
    plain = snapshot(cli.cwd / "pagedkv.duckdb")
    # one file named on the command line; another whose name says nothing of it
    (cli.cwd / "root_table.facts").write_bytes((packed / f"root_table.facts{suffix}").read_bytes())
    for path in (f"packed/virtual_token.facts{suffix}", "root_table.facts"):
        result: Any = cli("load", "--append", path)
        assert result.exit_code == 0, result.stderr
    assert snapshot(cli.cwd / "pagedkv.duckdb") == plain  # appended rows that were there


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_compressed_stdin_is_read_in_every_format(cli: Cli, kind: str) -> None:
    rows = (DATA / "root_table.facts").read_bytes()
    assert cli("load", "-", "-r", "root_table", input=_packed(kind, rows)).exit_code == 0
    table = pa.table({"seq_id": [1, 2], "block_table_ptr": [100, 200]})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    stream = _packed(kind, sink.getvalue().to_pybytes())
    result: Any = cli("load", "-", "-r", "root_table", "-f", "arrows", input=stream)
    assert result.exit_code == 0, result.stderr
    assert _rows(cli)["root_table"] == [(1, 100), (2, 200)]


def test_a_truncated_compressed_file_is_refused_naming_it(cli: Cli) -> None:
    data = _packed("gzip", (DATA / "virtual_token.facts").read_bytes())
    (cli.cwd / "virtual_token.facts.gz").write_bytes(data[:-12])
    result: Any = cli("load", "virtual_token.facts.gz")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error: virtual_token.facts.gz: its gzip data is corrupt or truncated ("
    )
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def _arrow_bytes(kind: str) -> bytes:
    table = pa.table({"seq_id": [1], "token_pos": [0], "block_index": [0], "offset_in_block": [0]})
    if kind == "parquet":
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        return bytes(sink.getvalue().to_pybytes())
    sink = pa.BufferOutputStream()
    new = ipc.new_file if kind == "arrow" else ipc.new_stream
    with new(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize(
    ("kind", "named"),
    [("arrows", "an Arrow IPC stream"), ("arrow", "an Arrow IPC file"), ("parquet", "Parquet")],
)
def test_binary_on_stdin_without_its_format_is_named_and_read_with_it(
    cli: Cli, kind: str, named: str
) -> None:
    """`cat x.arrows | load - -r virtual_token`: one line saying what it is and the -f to
    pass, not a 'not UTF-8' error a line; with the -f, it loads (Parquet and Arrow IPC
    files are spooled, since they are read by seeking)."""
    data = _arrow_bytes(kind)
    refused: Any = cli("load", "-", "-r", "virtual_token", input=data)
    assert refused.exit_code == 2
    assert refused.stderr == (
        f"Error: <stdin>: this is {named}, not facts text; nothing was loaded\n"
        f"Fix: pass -f {kind}\n"
    )
    assert not (cli.cwd / "pagedkv.duckdb").exists()
    (cli.cwd / "virtual_token.facts").write_bytes(data)  # a file misnamed: the same
    misnamed: Any = cli("load", "virtual_token.facts")
    assert misnamed.exit_code == 2
    assert f"this is {named}, not facts text" in misnamed.stderr
    assert f"Fix: pass -f {kind} (or name it .{kind})" in misnamed.stderr
    loaded_now: Any = cli("load", "-", "-r", "virtual_token", "-f", kind, input=data)
    assert loaded_now.exit_code == 0, loaded_now.stderr
    assert _rows(cli)["virtual_token"] == [(1, 0, 0, 0)]


def test_datalog_on_stdin_names_its_relations(cli: Cli) -> None:
    facts = b"// the seed\nroot_table(1, 100).\nroot_table(2, 200).\nswapped_block(9, 9, 9).\n"
    for args in (["-"], ["-", "-f", "dl"]):
        result: Any = cli("load", *args, input=facts)
        assert result.exit_code == 0, result.stderr
        assert _rows(cli)["root_table"] == [(1, 100), (2, 200)]
    refused: Any = cli("load", "-", "-f", "dl", "-r", "root_table", input=facts)
    assert refused.exit_code == 2
    assert refused.stderr.startswith("Error: --relation does not apply to Datalog facts")
    # plain facts without --relation: still asked for it (a tab-separated line is no fact)
    asked: Any = cli("load", "-", input=b"1\t100\n")
    assert asked.exit_code == 2 and "needs --relation NAME" in asked.stderr
