"""pagedkv-sql: the address-translation state of a PagedAttention KV cache, on DuckDB."""

from .check import Check, CheckReport, CheckResult
from .database import DEFAULT_DB, Database, connect, resolve_arrow
from .errors import (
    ConstraintError,
    DatabaseError,
    DatabaseLockedError,
    InputError,
    PagedKVError,
    Problem,
    UsageError,
    Violation,
)
from .load import LoadReport, RelationLoad
from .relations import INPUT_RELATIONS, OUTPUT_COLUMNS, OUTPUT_RELATION, arrow_schema

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_DB",
    "INPUT_RELATIONS",
    "OUTPUT_COLUMNS",
    "OUTPUT_RELATION",
    "Check",
    "CheckReport",
    "CheckResult",
    "ConstraintError",
    "Database",
    "DatabaseError",
    "DatabaseLockedError",
    "InputError",
    "LoadReport",
    "PagedKVError",
    "Problem",
    "RelationLoad",
    "UsageError",
    "Violation",
    "__version__",
    "arrow_schema",
    "connect",
    "resolve_arrow",
]
