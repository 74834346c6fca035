"""Types of the public API, for type checkers: input formats and what counts as Arrow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeAlias, get_args, runtime_checkable

# What `load` reads (by extension, or forced with ``format=``).
InputFormat: TypeAlias = Literal["facts", "tsv", "csv", "parquet", "arrow", "arrows", "dl"]
# The same formats as a tuple, in this order, for sources.discover's check; `load
# --format`'s choices are cli/core.py's InputFormatChoice (an Enum, which typer reads), a
# copy that tests/test_conventions.py holds equal to this list.
INPUT_FORMATS: tuple[InputFormat, ...] = get_args(InputFormat)
# the first bytes of the binary formats: a file or a stream without a name is told by them
BINARY_MAGIC = {b"PAR1": "parquet", b"ARROW1": "arrow", b"\xff\xff\xff\xff": "arrows"}
BINARY_NAMES = {"parquet": "Parquet", "arrow": "an Arrow IPC file", "arrows": "an Arrow IPC stream"}


def binary_format(head: bytes) -> str | None:
    """The binary format (parquet, arrow, arrows) the first bytes of an input name, or None."""
    for magic, fmt in BINARY_MAGIC.items():
        if head.startswith(magic):
            return fmt
    return None


@runtime_checkable
class ArrowStreamExportable(Protocol):
    """Anything that exports an Arrow C stream: pyarrow Tables and readers, polars,
    nanoarrow, DuckDB relations (the Arrow PyCapsule interface)."""

    def __arrow_c_stream__(self, requested_schema: Any = None) -> object: ...


@runtime_checkable
class ArrowArrayExportable(Protocol):
    """Anything that exports one Arrow C array with its schema: a pyarrow RecordBatch."""

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[object, object]: ...


@runtime_checkable
class DatasetLike(Protocol):
    """A ``pyarrow.dataset.Dataset``: scanned lazily by DuckDB."""

    @property
    def schema(self) -> Any: ...

    def scanner(self, *args: Any, **kwargs: Any) -> Any: ...

    def to_batches(self, *args: Any, **kwargs: Any) -> Any: ...


# a dict of column name -> array (numpy, torch, a CUDA tensor copied to the host once)
ArrowInput: TypeAlias = (
    ArrowStreamExportable | ArrowArrayExportable | DatasetLike | Mapping[str, Any]
)
