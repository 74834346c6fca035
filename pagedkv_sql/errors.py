"""One error hierarchy for the whole project.

Library code raises these and never prints or exits; the CLI turns them into a
one-line ``Error: ...`` on stderr (plus the listed details) and an exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class PagedKVError(Exception):
    """Base class of every error pagedkv-sql raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, details: list[str] | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.details: list[str] = list(details or [])
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(PagedKVError):
    """The call itself is wrong: an unknown relation, format or option combination."""

    exit_code = 2


class DatabaseError(PagedKVError):
    """The database cannot be opened or used (missing, locked, not a pagedkv database)."""


class DatabaseLockedError(DatabaseError):
    """Another process holds the database file."""


class QueryError(PagedKVError):
    """DuckDB refused a query given to ``Database.sql`` (its error is the ``__cause__``).
    ``str()`` is DuckDB's whole message: the first line, then the lines after it
    (candidate bindings, "Did you mean", the LINE and its caret), one a line; ``message``
    is the first line alone and ``details`` the others."""

    def __str__(self) -> str:
        return "\n".join([self.message, *self.details])


@dataclass(frozen=True)
class Problem:
    """One malformed piece of input, located as precisely as the format allows."""

    source: str
    line: int | None
    column: int | None
    message: str

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.message}"


class InputError(PagedKVError):
    """Input that cannot be read as facts (syntax, numbers, arity, encoding, schema)."""

    def __init__(
        self,
        message: str,
        problems: list[Problem] | None = None,
        total: int | None = None,
        hint: str = "",
    ) -> None:
        self.problems: list[Problem] = list(problems or [])
        self.total = total if total is not None else len(self.problems)
        super().__init__(message, [str(p) for p in self.problems], hint)


class FindingsInputError(InputError):
    """Bad input to a command whose exit status 1 means findings (``fleet check``): exit 2
    tells a directory that cannot be read from one that was read and found wrong."""

    exit_code = 2


@dataclass(frozen=True)
class Violation:
    """One row that breaks a rule, with where it came from when that is known."""

    check: str
    relation: str
    values: dict[str, Any]
    reason: str
    locations: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        vals = ", ".join(str(v) for v in self.values.values())
        where = f" at {', '.join(self.locations)}" if self.locations else ""
        return f"{self.relation}({vals}){where}: {self.reason}"


class ConstraintError(PagedKVError):
    """Facts that violate one of the spec's integrity constraints (or, under --strict, a
    diagnostic). The whole load is refused."""

    def __init__(
        self, message: str, violations: list[Violation], total: int, hint: str = ""
    ) -> None:
        self.violations = violations
        self.total = total
        super().__init__(message, [str(v) for v in violations], hint)
