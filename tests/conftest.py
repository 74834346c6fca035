from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import pagedkv_sql
from pagedkv_sql.cli import app
from pagedkv_sql.relations import INPUT_RELATIONS
from pagedkv_sql.textscan import MAX_LINE

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
SPEC = ROOT.parent / "shared" / "spec" / "paged_attention.dl"
SEED_OUTPUT = (
    "1\t0\t268435456\n1\t15\t268435471\n1\t16\t536870912\n1\t31\t536870927\n"
    "1\t32\t1879048192\n2\t0\t805306368\n2\t32\t1073741824\n"
)
Facts = dict[str, list[tuple[int, ...]]]


def pytest_report_header() -> list[str]:
    return [f"duckdb {duckdb.__version__}, pyarrow {pa.__version__}"]


@pytest.fixture
def db() -> Iterator[pagedkv_sql.Database]:
    """An in-memory database with the schema."""
    with pagedkv_sql.connect(":memory:") as database:
        yield database


def arrow_table(relation: str, rows: list[tuple[int, ...]]) -> pa.Table:
    """Facts of one relation as an Arrow table with the relation's int64 columns."""
    columns = INPUT_RELATIONS[relation]
    return pa.table({c: pa.array([r[i] for r in rows], pa.int64()) for i, c in enumerate(columns)})


def write_facts(directory: Path, facts: Facts, fmt: str = "facts") -> Path:
    """Write facts as one file a relation in any supported format."""
    import pyarrow.csv as pacsv
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    for relation, rows in facts.items():
        columns = INPUT_RELATIONS[relation]
        table = arrow_table(relation, rows)
        path = directory / f"{relation}.{fmt}"
        if fmt in ("facts", "tsv"):
            header = "\t".join(columns) + "\n" if fmt == "tsv" else ""
            path.write_text(header + "".join("\t".join(map(str, r)) + "\n" for r in rows))
        elif fmt == "csv":
            pacsv.write_csv(table, path)
        elif fmt == "parquet":
            pq.write_table(table, path)
        elif fmt == "arrow":
            with ipc.new_file(path, table.schema) as w:
                w.write_table(table)
        elif fmt == "arrows":
            with ipc.new_stream(path, table.schema) as w:
                w.write_table(table)
        elif fmt == "dl":
            path = directory / f"{relation}_facts.dl"
            path.write_text("".join(f"{relation}({', '.join(map(str, r))}).\n" for r in rows))
        else:
            raise ValueError(fmt)
    return directory


@pytest.fixture
def facts_dir(tmp_path: Path) -> Callable[..., Path]:
    """A factory: facts_dir({"root_table": [(1, 100)]}, fmt="csv") -> a directory."""
    counter = iter(range(1_000_000))

    def make(facts: Facts, fmt: str = "facts") -> Path:
        return write_facts(tmp_path / f"facts{next(counter)}", facts, fmt)

    return make


@pytest.fixture
def seed_dir(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    shutil.copytree(DATA, target)
    return target


class Cli:
    """Run the CLI in-process, in a working directory of the test's own."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.runner = CliRunner()

    def __call__(self, *args: str, input: bytes | str | None = None) -> object:
        old = Path.cwd()
        os.chdir(self.cwd)
        try:
            return self.runner.invoke(app, list(args), input=input, catch_exceptions=False)
        finally:
            os.chdir(old)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.delenv("PAGEDKV_DB", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    return Cli(work)


def snapshot(path: Path | str) -> dict[str, list[tuple[int, ...]]]:
    """Every stored relation, sorted: to prove a refused command changed nothing."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r: sorted(con.execute(f"SELECT * FROM {r}").fetchall()) for r in INPUT_RELATIONS}
    finally:
        con.close()


def _table_text(*batches: pa.RecordBatch, schema: pa.Schema | None = None) -> str:
    import io

    from pagedkv_sql.output import write_batches

    schema = schema or batches[0].schema
    out = io.BytesIO()
    write_batches(pa.RecordBatchReader.from_batches(schema, list(batches)), "table", out)
    return out.getvalue().decode()


CUT = 1 << 22  # textscan reads 4 MiB at a time, sources.preflight too


M = MAX_LINE


def _pad(size: int) -> bytes:
    """``size`` bytes of complete lines of decimal digits (each ends with LF)."""
    count, rest = divmod(size, 1000)
    lines = [b"5" * 999 + b"\n"] * count
    if rest:
        lines[-1] = b"5" * (999 + rest) + b"\n"
    return b"".join(lines)


class _ArrowStream:
    """An object that exports an Arrow C stream (as polars or a DuckDB result do), read once."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.table.schema, self.table.to_batches())
        return reader.__arrow_c_stream__(requested_schema)


def _insert(db: pagedkv_sql.Database, relation: str, rows: list[tuple[int, ...]]) -> None:
    """Rows as a DuckDB shell user would INSERT them: exact duplicates stay."""
    marks = ", ".join("?" * len(rows[0]))
    db.con.executemany(f"INSERT INTO {relation} VALUES ({marks})", rows)


def _view(db: pagedkv_sql.Database, view: str, columns: str = "*") -> list[tuple[Any, ...]]:
    return db.con.execute(f"SELECT {columns} FROM {view} ORDER BY ALL").fetchall()


def _streamed(db: pagedkv_sql.Database, batches: list[list[tuple[int, ...]]]) -> list[list[Any]]:
    tables = [arrow_table("virtual_token", b) for b in batches]
    return [[tuple(r.values()) for r in out.to_pylist()] for out in db.resolve_stream(tables)]


def on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on one pseudo-terminal: what it drew."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedkv_sql", *args],
        cwd=cwd,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    proc.wait()
    os.close(primary)
    return proc.returncode, seen.decode()
