"""`sql` (any SQL on the database, DuckDB's whole message when it refuses) and `example`
(the README's data, to try the rest on): the commands of a first session beside the core."""

from __future__ import annotations

import sys

import typer

from .. import paths
from ..formats import RowsFormat
from . import common
from .common import DbOption, OutOption, guard

# `sql` without --write: no file but the database, no network (COPY TO, EXPORT DATABASE,
# ATTACH, INSTALL, read_csv of another file are refused by DuckDB itself)
READ_ONLY = "SET enable_external_access = false"


def register(app: typer.Typer) -> None:
    app.command("sql")(sql_command)
    app.command()(example)


def sql_command(
    query: str = typer.Argument(
        ..., metavar="QUERY", help="SQL, or - to read it from stdin.", show_default=False
    ),
    db: str | None = DbOption,
    fmt: RowsFormat | None = common.format_option(
        "Output format (default: from the --output extension, else table)."
    ),
    out: str | None = OutOption,
    write: bool = typer.Option(
        False,
        "--write",
        help="Allow statements that change the database, and DuckDB's access to other "
        "files and the network (COPY TO, EXPORT, ATTACH, INSTALL, read_csv...); the "
        "database must exist. Without it the session reads the database and nothing else.",
    ),
) -> None:
    """Run SQL against the database (as `duckdb -c`, sqlite-utils `query`) and print the
    last statement's rows in any of resolve's formats. Read only unless --write: the
    database opened read-only and DuckDB's external access off, so no statement writes or
    reads another file or reaches the network. A refused query shows DuckDB's whole message
    (candidates, 'Did you mean', the LINE and its caret)."""
    from .. import output
    from ..connection import query_error
    from ..errors import DatabaseError

    with guard():
        rows_format = common.rows_format(out, fmt, "table", common.db_path(db))
        common.refuse_binary_to_terminal(out, rows_format)
        text = _query_text(query)
    with (
        guard(),
        common.open_db(db, read_only=not write, must_exist=True) as database,
        common.open_output(out, database.path) as stream,
    ):
        try:
            with (
                common.progress(database, "sql", out),
                database.cursor("sql", write=write) as cur,
            ):
                if not write:  # DuckDB refuses to turn it on again while the database runs
                    cur.execute(READ_ONLY)
                result = cur.sql(text)
                if result is not None:  # a statement with rows
                    output.write_batches(result.to_arrow_reader(65536), rows_format, stream)
        except DatabaseError as e:
            hint = ""
            if "read-only" in e.message:
                hint = "pass --write to change the database"
            elif not write and "disabled by configuration" in e.message:
                hint = (
                    "without --write `sql` reads the database and no other file; pass --write "
                    "to let DuckDB write or read files (COPY TO, EXPORT, read_csv...) or install "
                    "extensions"
                )
            raise query_error("sql", e.__cause__ or e, hint) from e


def _query_text(query: str) -> str:
    """QUERY, or with '-' the SQL on stdin (UTF-8), as `load -` and `replay -` read it."""
    from ..errors import InputError, UsageError

    if query != "-":
        return query
    if paths.CLOSED_STREAMS & {0}:
        raise UsageError("QUERY is '-' but standard input is closed", hint="pipe the SQL in")
    try:
        text = sys.stdin.buffer.read().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(
            f"<stdin>: the SQL is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    if not text.strip():
        raise UsageError("no SQL on stdin", hint="pipe a query in, or give it as QUERY")
    return text


def example(
    out_dir: str = typer.Argument(
        ..., metavar="DIR", help="Directory to write (made if missing).", show_default=False
    ),
) -> None:
    """Write the README's example data into DIR: the spec's test facts and a FlashInfer
    snapshot (engines/flashinfer.npz), as the wheel ships them. Nothing is replaced."""
    from .. import example as example_data

    with guard():
        written = example_data.write(out_dir)
    shown = ", ".join(str(p.relative_to(out_dir)) for p in written)
    common.err(f"wrote {out_dir}: {shown}")
