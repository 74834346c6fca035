"""What many test files share: the repository's places and the seed's golden output, facts
written in every format, the CLI run in process and on a terminal, a database's state,
the random facts of the differential tests, step logs and the rows of a table."""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from typer.testing import CliRunner

import pagedkv_sql
from pagedkv_sql.cli import app
from pagedkv_sql.engines import Snapshot, flashinfer
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


def snapshot(path: Path | str) -> dict[str, list[tuple[int, ...]]]:
    """Every stored relation, sorted: to prove a refused command changed nothing."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r: sorted(con.execute(f"SELECT * FROM {r}").fetchall()) for r in INPUT_RELATIONS}
    finally:
        con.close()


def table_text(*batches: pa.RecordBatch, schema: pa.Schema | None = None) -> str:
    import io

    from pagedkv_sql.output import write_batches

    schema = schema or batches[0].schema
    out = io.BytesIO()
    write_batches(pa.RecordBatchReader.from_batches(schema, list(batches)), "table", out)
    return out.getvalue().decode()


CUT = 1 << 22  # textscan reads 4 MiB at a time, sources.preflight too


M = MAX_LINE


def pad(size: int) -> bytes:
    """``size`` bytes of complete lines of decimal digits (each ends with LF)."""
    count, rest = divmod(size, 1000)
    lines = [b"5" * 999 + b"\n"] * count
    if rest:
        lines[-1] = b"5" * (999 + rest) + b"\n"
    return b"".join(lines)


class ArrowStream:
    """An object that exports an Arrow C stream (as polars or a DuckDB result do), read once."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.table.schema, self.table.to_batches())
        return reader.__arrow_c_stream__(requested_schema)


def insert(db: pagedkv_sql.Database, relation: str, rows: list[tuple[int, ...]]) -> None:
    """Rows as a DuckDB shell user would INSERT them: exact duplicates stay."""
    marks = ", ".join("?" * len(rows[0]))
    db.con.executemany(f"INSERT INTO {relation} VALUES ({marks})", rows)


def view_rows(db: pagedkv_sql.Database, view: str, columns: str = "*") -> list[tuple[Any, ...]]:
    return db.con.execute(f"SELECT {columns} FROM {view} ORDER BY ALL").fetchall()


def streamed(db: pagedkv_sql.Database, batches: list[list[tuple[int, ...]]]) -> list[list[Any]]:
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


PAGE = 16


def csr(lengths: list[int], pages: list[list[int]]) -> dict[str, np.ndarray]:
    """FlashInfer's three arrays for sequences of ``lengths`` tokens on ``pages``."""
    indptr = np.zeros(len(pages) + 1, dtype=np.int32)
    indptr[1:] = np.cumsum([len(p) for p in pages])
    indices = np.array([x for p in pages for x in p], dtype=np.int32)
    last = np.array(
        [n - (len(p) - 1) * PAGE for n, p in zip(lengths, pages, strict=True)], dtype=np.int32
    )
    return {"kv_indptr": indptr, "kv_indices": indices, "kv_last_page_len": last}


def snap(lengths: list[int], pages: list[list[int]], **kw: object) -> Snapshot:
    a = csr(lengths, pages)
    return flashinfer.snapshot(a["kv_indptr"], a["kv_indices"], a["kv_last_page_len"], PAGE, **kw)


# One block resident and swapped at the same address: every token of it resolves to the
# same physical address through both rules, so the bag of the two rules holds each output
# row twice, side by side once sorted.
BOTH_TIERS: dict[str, list[tuple[int, ...]]] = {
    "root_table": [(1, 10)],
    "block_table_entry": [(10, 0, 0x1000, 1)],
    "swapped_block": [(10, 0, 0x1000)],
    "virtual_token": [(1, pos, 0, pos) for pos in range(5)],
}
BOTH_TIERS_OUTPUT = [(1, pos, 0x1000 + pos) for pos in range(5)]


def table_rows(table: pa.Table | pa.RecordBatch) -> list[tuple[int, ...]]:
    return [tuple(r.values()) for r in table.to_pylist()]


def load_arrow_facts(db: pagedkv_sql.Database, facts: dict[str, list[tuple[int, ...]]]) -> None:
    for relation, data in facts.items():
        db.load_arrow(relation, arrow_table(relation, data), diagnostics=False)


# The CLI's wing: the shell's commands, imported downwards only (no import after code, no
# private name of cli/ reached from spark/cli.py).
PACKAGE_PATH = Path(pagedkv_sql.__file__).parent
WING = PACKAGE_PATH / "cli"


def tsv(table: pa.Table) -> str:
    return "".join("\t".join(map(str, r.values())) + "\n" for r in table.to_pylist())


def unresolved(n: int) -> dict[str, list[tuple[int, ...]]]:
    """n tokens of a sequence that has no block table: n diag_unresolved_token findings."""
    return {"virtual_token": [(7, p, 0, p) for p in range(n)]}


CLEAN: dict[str, list[tuple[int, ...]]] = {
    "root_table": [(1, 10), (2, 11)],
    "block_table_entry": [(10, 0, 0x1000, 2), (11, 0, 0x1000, 2), (10, 1, 0x1100, 1)],
    "virtual_token": [(1, 0, 0, 0), (1, 17, 1, 1), (2, 5, 0, 5), (2, 16, 1, 0)],
    "swapped_block": [(11, 1, 0x9000)],
}


def load_facts(db: pagedkv_sql.Database, facts_dir: Callable[..., Path], facts: Any) -> None:
    db.load(facts_dir(facts), diagnostics=False)


def console_blocks(text: str, info: str = "console") -> list[list[tuple[str, str]]]:
    """Each ```console block (or the blocks whose info string is ``info``: the engines
    tier's are ```console engines, run there) as its commands with their output."""
    blocks = []
    for body in re.findall(rf"```{re.escape(info)}\n(.*?)```", text, re.S):
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
        blocks.append([(cmd, "".join(o + "\n" for o in out)) for cmd, out in steps])
    return blocks


SEED: dict[str, list[tuple[int, ...]]] = {
    "root_table": [(1, 100), (2, 101)],
    "block_table_entry": [
        (100, 0, 0x10000000, 2),
        (100, 1, 0x20000000, 1),
        (101, 0, 0x30000000, 1),
        (101, 2, 0x40000000, 1),
    ],
    "virtual_token": [
        (1, 0, 0, 0),
        (1, 15, 0, 15),
        (1, 16, 1, 0),
        (1, 31, 1, 15),
        (1, 32, 2, 0),
        (2, 0, 0, 0),
        (2, 16, 1, 0),
        (2, 32, 2, 0),
    ],
    "swapped_block": [(100, 2, 0x70000000)],
}


def state(db: pagedkv_sql.Database) -> dict[str, list[tuple[int, ...]]]:
    return {
        r: [
            tuple(x.values())
            for x in db.sql(f"SELECT * FROM {r} ORDER BY ALL").to_arrow_table().to_pylist()
        ]
        for r in SEED
    }


DUCKDB_SHELL = shutil.which("duckdb", path=str(Path(sys.executable).parent)) or shutil.which(
    "duckdb"
)


plan_small = st.integers(min_value=0, max_value=3)
check_facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(plan_small, st.integers(10, 13)), max_size=6),
        "block_table_entry": st.lists(
            st.tuples(
                st.integers(10, 14),
                plan_small,
                st.integers(0, 5).map(lambda x: x * 256),
                plan_small,
            ),
            max_size=10,
        ),
        "virtual_token": st.lists(
            st.tuples(plan_small, st.integers(0, 40), plan_small, st.integers(0, 20)), max_size=16
        ),
        "swapped_block": st.lists(
            st.tuples(st.integers(10, 14), plan_small, st.integers(0, 40).map(lambda x: x * 64)),
            max_size=6,
        ),
    }
)


resolve_small = st.integers(min_value=-3, max_value=3)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
near_edge = st.sampled_from([2**63 - 1, 2**63 - 200, -(2**63), -(2**63) + 255, 0])
address = st.one_of(INT64, near_edge, st.integers(-4, 4).map(lambda x: x * 256))
aligned = st.one_of(
    st.integers(min_value=-(2**55), max_value=2**55 - 1).map(lambda x: x * 256),
    st.sampled_from([2**63 - 256, -(2**63), 0]),
)

resolve_facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(resolve_small, resolve_small), max_size=6),
        "block_table_entry": st.lists(
            st.tuples(resolve_small, resolve_small, aligned, st.integers(0, 3)), max_size=8
        ),
        "virtual_token": st.lists(
            st.tuples(resolve_small, st.integers(-5, 40), resolve_small, st.integers(0, 255)),
            max_size=12,
        ),
        "swapped_block": st.lists(st.tuples(resolve_small, resolve_small, address), max_size=6),
    }
).map(
    # sprinkle exact duplicates
    lambda f: {k: v + v[: len(v) // 2] for k, v in f.items()}
)


SEED_CACHE: dict[str, list[tuple[int, ...]]] = {}


def seed_state() -> dict[str, list[tuple[int, ...]]]:
    """The seed data as snapshot() shows it."""
    if not SEED_CACHE:
        with pagedkv_sql.connect(":memory:") as db:
            db.load(DATA)
            for r in ("root_table", "block_table_entry", "virtual_token", "swapped_block"):
                rows = db.sql(f"SELECT * FROM {r}").to_arrow_table().to_pylist()
                SEED_CACHE[r] = sorted(tuple(x.values()) for x in rows)
    return SEED_CACHE


def loaded(cli: Cli, db: str = "pagedkv.duckdb") -> Path:
    result: Any = cli("load", str(DATA), "--db", db)
    assert result.exit_code == 0, result.stderr
    return cli.cwd / db


def loaded_roots(path: Path) -> list[tuple[Any, ...]]:
    """The rows of root_table after loading ``path`` into a fresh database, sorted."""
    with pagedkv_sql.connect(":memory:") as db:
        db.load(path)
        return db.con.execute("SELECT * FROM root_table ORDER BY ALL").fetchall()


def settings(db: pagedkv_sql.Database) -> tuple[str, str]:
    row = db.sql(
        "SELECT current_setting('memory_limit'), current_setting('temp_directory')"
    ).fetchall()[0]
    return str(row[0]), str(row[1])
