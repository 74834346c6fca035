"""pagedkv-sql: the address-translation state of a PagedAttention KV cache, on DuckDB."""

import logging as _logging
from importlib import metadata as _metadata

from .check import Check, CheckReport, CheckResult
from .database import DEFAULT_DB, Database, connect, resolve_arrow
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
from .load import LoadReport, RelationLoad
from .relations import INPUT_RELATIONS, OUTPUT_COLUMNS, OUTPUT_RELATION, arrow_schema
from .types import ArrowInput, InputFormat

# a library logs, the application decides where to: silent unless configured
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

try:  # one version source: pyproject.toml, as installed
    __version__ = _metadata.version("pagedkv-sql")
except _metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
    __version__ = "0+unknown"

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
