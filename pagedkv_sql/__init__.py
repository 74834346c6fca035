"""pagedkv-sql: the address-translation state of a PagedAttention KV cache, on DuckDB.

The names below load on first use (PEP 562), so that `pagedkv-sql --help`, `--version` and
TAB completion start without DuckDB, pyarrow and numpy; `from pagedkv_sql import Database`
works as before."""

from __future__ import annotations

import logging as _logging
from typing import TYPE_CHECKING, Any

from .lazy import attribute as _attribute

if TYPE_CHECKING:
    __version__: str

    from .check import CheckReport, CheckResult
    from .database import Database, connect, resolve_arrow
    from .errors import (
        ConstraintError,
        DatabaseError,
        DatabaseLockedError,
        InputError,
        PagedKVError,
        Problem,
        QueryError,
        UsageError,
        Violation,
    )
    from .invariants import Check
    from .load import LoadReport, RelationLoad
    from .paths import DEFAULT_DB
    from .relations import INPUT_RELATIONS, OUTPUT_COLUMNS, OUTPUT_RELATION, arrow_schema
    from .types import ArrowInput, InputFormat

# a library logs, the application decides where to: silent unless configured
_logging.getLogger(__name__).addHandler(_logging.NullHandler())


# each public name -> the module that defines it
_LAZY = {
    "Check": "invariants",
    **dict.fromkeys(["CheckReport", "CheckResult"], "check"),
    **dict.fromkeys(["Database", "connect", "resolve_arrow"], "database"),
    "DEFAULT_DB": "paths",
    **dict.fromkeys(
        [
            "ConstraintError",
            "DatabaseError",
            "DatabaseLockedError",
            "InputError",
            "PagedKVError",
            "Problem",
            "QueryError",
            "UsageError",
            "Violation",
        ],
        "errors",
    ),
    **dict.fromkeys(["LoadReport", "RelationLoad"], "load"),
    **dict.fromkeys(
        ["INPUT_RELATIONS", "OUTPUT_COLUMNS", "OUTPUT_RELATION", "arrow_schema"], "relations"
    ),
    **dict.fromkeys(["ArrowInput", "InputFormat"], "types"),
}


def _read_version() -> str:
    """One version source: pyproject.toml, as installed (importlib.metadata: 20 ms, read
    the first time `__version__` is asked for, as `--version` does)."""
    from importlib import metadata

    try:
        return metadata.version("pagedkv-sql")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = version = _read_version()
        return version
    value = _attribute(__name__, _LAZY, name)
    globals()[name] = value  # once: the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "__version__"})


__all__ = [
    "DEFAULT_DB",
    "INPUT_RELATIONS",
    "OUTPUT_COLUMNS",
    "OUTPUT_RELATION",
    "ArrowInput",
    "Check",
    "CheckReport",
    "CheckResult",
    "ConstraintError",
    "Database",
    "DatabaseError",
    "DatabaseLockedError",
    "InputError",
    "InputFormat",
    "LoadReport",
    "PagedKVError",
    "Problem",
    "QueryError",
    "RelationLoad",
    "UsageError",
    "Violation",
    "__version__",
    "arrow_schema",
    "connect",
    "resolve_arrow",
]
