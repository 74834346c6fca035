"""The schema a pagedkv database keeps beside its facts: created (or brought up to date)
from the SQL files on a writable open, checked on every open, and stamped with the digest
of the statements it was made from, so that a current database is not written to."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import duckdb

from .dbutil import run, scalar
from .errors import DatabaseError
from .sqlfiles import SQL_FILES, statements_in

if TYPE_CHECKING:
    from .database import Database

SCHEMA_VERSION = 1


def create(db: Database, force: bool = False) -> None:
    """Create (or bring up to date) the tables, views and macros of the SQL files. A
    database already current is not written to: the statements' digest is kept as
    the comment of pagedkv_settings (no WAL to checkpoint on a full disk, no work)."""
    check(db, missing_ok=True)
    statements = [
        stmt.sql
        for file in SQL_FILES
        for stmt in statements_in(file)
        if stmt.sql.lstrip().upper().startswith(("CREATE", "INSERT"))
    ]
    digest = hashlib.sha256("\n;\n".join(statements).encode()).hexdigest()
    stamp = f"pagedkv-sql schema {digest}"
    with db.cursor("creating the schema", write=True) as cur:
        if not force and schema_stamp(cur) == stamp and not missing_objects(cur):
            return
        run(cur, "BEGIN")
        for sql in statements:
            run(cur, sql)
        run(cur, f"COMMENT ON TABLE pagedkv_settings IS '{stamp}'")
        run(cur, "COMMIT")


def check(db: Database, missing_ok: bool = False) -> None:
    """Refuse a database that is not pagedkv-sql's, of another schema version, or (unless
    ``missing_ok``) lacking some of its views and macros."""
    with db.cursor("reading the schema") as cur:
        found = scalar(
            cur, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'pagedkv_settings'"
        )
        foreign = scalar(cur, "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary")
    if not found:
        if missing_ok:
            if foreign:
                raise DatabaseError(
                    f"{db.path} is a DuckDB database but not a pagedkv-sql one",
                    hint="point --db at a new file or at one made by pagedkv-sql",
                )
            return
        raise DatabaseError(
            f"{db.path} is not a pagedkv-sql database (no pagedkv_settings table)",
            hint="create one with `pagedkv-sql load SOURCE`",
        )
    version = db.setting("schema_version")
    if version != SCHEMA_VERSION:
        raise DatabaseError(
            f"{db.path} has schema version {version}; this pagedkv-sql reads "
            f"version {SCHEMA_VERSION}"
        )
    if not missing_ok:
        with db.cursor("reading the schema") as cur:
            missing = missing_objects(cur)
        if missing:
            raise DatabaseError(
                f"{db.path} lacks {', '.join(missing)} (dropped from the DuckDB shell?)",
                hint=f"recreate them with `pagedkv-sql repair --db {db.path}`; "
                "the facts are untouched",
            )


_CREATED = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|VIEW|MACRO)\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I
)


def missing_objects(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tables, views and macros of the SQL files that the database lacks."""
    wanted = [
        (m.group(1).lower(), m.group(2))
        for file in SQL_FILES
        for stmt in statements_in(file)
        if (m := _CREATED.match(stmt.sql.lstrip()))
    ]
    present = {
        name
        for (name,) in run(
            con,
            "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM "
            "duckdb_views() UNION ALL SELECT function_name FROM duckdb_functions() "
            "WHERE function_type IN ('macro', 'table_macro')",
        )
    }
    return [f"{kind} {name}" for kind, name in wanted if name not in present]


def schema_stamp(con: duckdb.DuckDBPyConnection) -> str | None:
    """The digest of the SQL files the schema was last created from (None: never)."""
    rows = run(
        con,
        "SELECT comment FROM duckdb_tables() WHERE table_name = 'pagedkv_settings' "
        "AND database_name = current_database() AND schema_name = current_schema()",
    )
    return str(rows[0][0]) if rows and rows[0][0] else None
