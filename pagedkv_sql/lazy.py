"""Names a package loads on first use (PEP 562), so that importing it stays light: the
package's public API (``pagedkv_sql``: no DuckDB for ``--help``), ``live``'s doors (msgspec
only when one is used), ``spark``'s (pyspark only then). Standard library only."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def attribute(package: str, where: Mapping[str, str], name: str) -> Any:
    """The attribute ``name`` of ``package``, imported from the module that ``where``
    names for it (relative to the package); AttributeError for a name it does not know."""
    module = where.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", package), name)
