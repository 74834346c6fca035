from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import pagedkv_sql
from pagedkv_sql.cli import app
from pagedkv_sql.relations import INPUT_RELATIONS

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
