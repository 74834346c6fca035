"""Named SQL statements, aiosql style.

Each file in ``sql/`` is a list of statements, each introduced by ``-- name: NAME``;
the ``--`` comment lines right after the name are the statement's documentation: a
doc shown to users, then, from a line starting ``Plan:``, the internal note on how the
query runs (kept apart: a user never reads the plan as a check's description).
The files ship inside the wheel (``pagedkv_sql/sql``); in a source checkout they are
read from the top-level ``sql/`` folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from .errors import PagedKVError

SQL_FILES = ("schema.sql", "constraints.sql", "resolve.sql", "inspect.sql")
_NAME = re.compile(r"^--\s*name:\s*(.*?)\s*$")
_VALID_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class Statement:
    name: str
    file: str
    line: int
    doc: str
    sql: str
    plan: str = ""


class SQLFileError(PagedKVError):
    """A packaged SQL file is malformed: a bug in pagedkv-sql itself, not in user input."""


def sql_dir() -> Path:
    packaged = resources.files("pagedkv_sql") / "sql"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "sql"


def parse(text: str, file: str) -> list[Statement]:
    """Split one file into named statements, refusing empty, duplicate or malformed names."""
    statements: list[Statement] = []
    current: tuple[str, int] | None = None
    body: list[str] = []
    doc: list[str] = []
    plan: list[str] = []

    def flush() -> None:
        if current is None:
            return
        name, line = current
        sql = "\n".join(body).strip()
        if not sql:
            raise SQLFileError(f"{file}:{line}: statement '{name}' is empty")
        statements.append(
            Statement(name, file, line, " ".join(doc).strip(), sql, " ".join(plan).strip())
        )

    for number, raw in enumerate(text.splitlines(), start=1):
        match = _NAME.match(raw)
        if match:
            flush()
            name = match.group(1)
            if not _VALID_NAME.match(name):
                raise SQLFileError(f"{file}:{number}: invalid statement name '{name}'")
            if any(s.name == name for s in statements):
                raise SQLFileError(f"{file}:{number}: duplicate statement name '{name}'")
            current, body, doc, plan = (name, number), [], [], []
        elif current is None:
            if raw.strip() and not raw.lstrip().startswith("--"):
                raise SQLFileError(f"{file}:{number}: SQL before the first '-- name:' header")
        elif raw.startswith("--") and not body:
            line = raw[2:].strip()
            if plan or line.startswith("Plan:"):
                plan.append(line)
            else:
                doc.append(line)
        else:
            body.append(raw)
    flush()
    return statements


@cache
def load_all() -> dict[str, Statement]:
    found: dict[str, Statement] = {}
    for file in SQL_FILES:
        path = sql_dir() / file
        for stmt in parse(path.read_text(encoding="utf-8"), file):
            if stmt.name in found:
                other = found[stmt.name]
                raise SQLFileError(
                    f"{file}:{stmt.line}: statement name '{stmt.name}' is already used at "
                    f"{other.file}:{other.line}"
                )
            found[stmt.name] = stmt
    return found


def statement(name: str) -> str:
    try:
        return load_all()[name].sql
    except KeyError:
        raise SQLFileError(f"unknown SQL statement '{name}'") from None


def statements_in(file: str) -> list[Statement]:
    """The statements of one file: a core file (SQL_FILES, part of every database) or a
    capability's own file (e.g. engines.sql), read when that capability asks for it."""
    if file not in SQL_FILES:
        return list(_capability_file(file))
    return [s for s in load_all().values() if s.file == file]


@cache
def _capability_file(file: str) -> tuple[Statement, ...]:
    return tuple(parse((sql_dir() / file).read_text(encoding="utf-8"), file))
