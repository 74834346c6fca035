"""The Parquet layout Spark reads and writes: ``DIR/<relation>/[<column>=<value>/]*.parquet``.

``export_parquet`` writes one database's relations in it, as one partition value when a
partition is named (``replica=7``): many databases exported into one directory (one a
replica, or one a snapshot time) make the fleet's data set that ``pagedkv-sql spark``
resolves per partition value. DuckDB writes the files; pyspark is not needed here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from ..errors import InputError, UsageError
from ..filesets import file_set
from ..relations import INPUT_RELATIONS

if TYPE_CHECKING:
    from ..database import Database

_VALUE = re.compile(r"^[A-Za-z0-9_.+-]+$")
DATA_FILE = "data.parquet"


def parse_partition(text: str | None) -> tuple[str, str] | None:
    """``column=value`` as a pair, refusing what would not survive as a directory name."""
    if text is None:
        return None
    column, sep, value = text.partition("=")
    if not sep or not value:
        raise UsageError(
            f"--partition '{text}' is not COLUMN=VALUE", hint="e.g. --partition replica=7"
        )
    from .translate import check_partition_column  # sqlglot: the spark extra's

    check_partition_column(column)
    if not _VALUE.match(value):
        raise UsageError(
            f"partition value '{value}' has characters a directory name would change",
            hint="use letters, digits and . _ + - (e.g. 2026-11-30T06.00)",
        )
    return column, value


def export_parquet(
    db: Database,
    out_dir: str | Path,
    partition: tuple[str, str] | None = None,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Write every input relation and the settings of a Database under ``out_dir``; refuse
    to replace an existing relation (or partition) unless ``overwrite``. All or nothing:
    the files are written aside first, then moved into place."""
    with db.cursor("export parquet") as cur:
        return _export(cur, Path(out_dir), partition, overwrite)


def _export(
    con: duckdb.DuckDBPyConnection, out: Path, partition: tuple[str, str] | None, overwrite: bool
) -> list[Path]:
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    sub = f"{partition[0]}={partition[1]}" if partition else ""
    relations = [*INPUT_RELATIONS, "pagedkv_settings"]  # translate.SETTINGS (no sqlglot)
    targets = {r: (out / r / sub if sub else out / r) for r in relations}
    if not overwrite:
        taken = [str(t) for t in targets.values() if t.exists() and any(t.iterdir())]
        if taken:
            raise UsageError(
                f"{taken[0]} already holds data"
                + (f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""),
                hint="pass --overwrite to replace it, or export to another partition value",
            )
    out.mkdir(parents=True, exist_ok=True)
    names = [targets[r].relative_to(out).as_posix() for r in relations]
    with file_set(out, names) as draft:
        for relation, name in zip(relations, names, strict=True):
            staged = draft / name
            staged.mkdir(parents=True)
            path = str(staged / DATA_FILE).replace("'", "''")
            con.execute(
                f"COPY (SELECT * FROM {relation}) TO '{path}' (FORMAT parquet, COMPRESSION zstd)"
            )
    return [targets[r] / DATA_FILE for r in relations]


def check_input_dir(root: str) -> None:
    if "://" in root:
        return  # a cluster's file system: Spark says what is wrong with it
    path = Path(root)
    if not path.exists():
        raise InputError(f"input directory {root} does not exist")
    if not path.is_dir():
        raise InputError(
            f"input {root} is not a directory",
            hint="give a directory with one subdirectory a relation: root_table/, "
            "block_table_entry/, virtual_token/, swapped_block/",
        )
    if not any((path / r).exists() for r in INPUT_RELATIONS):
        raise InputError(
            f"{root} holds none of the spec's relations",
            hint="expected subdirectories root_table/, block_table_entry/, virtual_token/, "
            "swapped_block/ (write them with `pagedkv-sql export parquet`)",
        )
